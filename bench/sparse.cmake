# Plan-building benchmark for the block-sparse planner; included from bench/CMakeLists.txt.
# Guarded so the tree still configures until worker/CMakeLists.txt adds worker/sparse.
if(TARGET meshrun::worker::sparse)
  add_executable(meshrun_sparse_plan_bench ${CMAKE_CURRENT_LIST_DIR}/sparse_plan_bench.cc)
  target_link_libraries(meshrun_sparse_plan_bench PRIVATE meshrun::worker::sparse absl::strings)
else()
  message(WARNING "meshrun::worker::sparse is not defined; skipping meshrun_sparse_plan_bench")
endif()
