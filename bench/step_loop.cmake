# Step-loop benchmark: StepLoop vs a bare Execute loop on the same executables, and telemetry
# off vs cadence 1 / 100. Included from bench/CMakeLists.txt.
if(TARGET meshrun::runtime::pjrt)
  add_executable(meshrun_step_loop_bench ${CMAKE_CURRENT_LIST_DIR}/step_loop_bench.cc)
  target_link_libraries(meshrun_step_loop_bench PRIVATE
    meshrun::worker meshrun::runtime::backends meshrun::testing
    absl::strings absl::synchronization)
  target_compile_definitions(meshrun_step_loop_bench PRIVATE MESHRUN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
else()
  message(STATUS "MESHRUN_WITH_PJRT is OFF: no meshrun_step_loop_bench")
endif()
