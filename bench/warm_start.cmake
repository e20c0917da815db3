# Warm-start benchmark: time to first step after compiling (cold) vs after loading the
# serialized executables from the worker's store (warm). Included from bench/CMakeLists.txt.
if(TARGET meshrun::runtime::pjrt)
  add_executable(meshrun_warm_start_bench ${CMAKE_CURRENT_LIST_DIR}/warm_start_bench.cc)
  target_link_libraries(meshrun_warm_start_bench PRIVATE
    meshrun::worker meshrun::runtime::backends meshrun::testing)
  target_compile_definitions(meshrun_warm_start_bench PRIVATE MESHRUN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
else()
  message(STATUS "MESHRUN_WITH_PJRT is OFF: no meshrun_warm_start_bench")
endif()
