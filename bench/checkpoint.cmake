# Checkpoint benchmark: step-loop overhead of a checkpoint every 100 steps, the saver's write
# throughput vs a plain write+fsync, restore vs cold start. Included from bench/CMakeLists.txt.
if(TARGET meshrun::runtime::pjrt)
  add_executable(meshrun_checkpoint_bench ${CMAKE_CURRENT_LIST_DIR}/checkpoint_bench.cc)
  target_link_libraries(meshrun_checkpoint_bench PRIVATE
    meshrun::worker meshrun::checkpoint meshrun::runtime::backends
    meshrun::testing absl::strings absl::synchronization)
  target_compile_definitions(meshrun_checkpoint_bench PRIVATE MESHRUN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()
