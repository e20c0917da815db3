# Runtime benchmark: transformer steps through meshrun's PJRT runtime vs JAX on the same devices,
# and compile vs deserialize-and-load time. Included from bench/CMakeLists.txt.
if(TARGET meshrun::runtime::pjrt)
  add_executable(meshrun_runtime_step_bench ${CMAKE_CURRENT_LIST_DIR}/runtime_step_bench.cc)
  target_link_libraries(meshrun_runtime_step_bench PRIVATE
    meshrun::testing meshrun::runtime::backends
    meshrun::runtime::pjrt absl::time)
  target_compile_definitions(meshrun_runtime_step_bench PRIVATE
    MESHRUN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" MESHRUN_PYTHON="${MESHRUN_PYTHON}")
else()
  message(STATUS "MESHRUN_WITH_PJRT is OFF: no meshrun_runtime_step_bench")
endif()
