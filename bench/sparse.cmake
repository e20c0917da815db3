# Plan-building benchmark for the block-sparse planner; included from bench/CMakeLists.txt.
# Guarded so the tree still configures until worker/CMakeLists.txt adds worker/sparse.
if(TARGET meshrun::worker::sparse)
  add_executable(meshrun_sparse_plan_bench ${CMAKE_CURRENT_LIST_DIR}/sparse_plan_bench.cc)
  target_link_libraries(meshrun_sparse_plan_bench PRIVATE meshrun::worker::sparse absl::strings)
else()
  message(WARNING "meshrun::worker::sparse is not defined; skipping meshrun_sparse_plan_bench")
endif()

# Plan time per batch vs the sparse example's step through the runtime (needs the PJRT plugin).
if(TARGET meshrun::worker::sparse::batches AND TARGET meshrun::runtime::pjrt
   AND TARGET meshrun::coordinator::service)
  add_executable(meshrun_sparse_step_bench ${CMAKE_CURRENT_LIST_DIR}/sparse_step_bench.cc)
  target_link_libraries(meshrun_sparse_step_bench PRIVATE
    meshrun::coordinator::service meshrun::worker::service meshrun::worker::sparse::batches
    meshrun::testing
    meshrun::runtime::backends meshrun::runtime::pjrt)
  target_compile_definitions(meshrun_sparse_step_bench PRIVATE MESHRUN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()
