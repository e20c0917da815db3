# Fan-out benchmark: one job's summaries to 500 watchers through a real CoordinatorServer
# (upload, combine, SQLite history, watch hub) vs a bare gRPC server streaming the same messages
# from memory, read by the same callback clients. Included from bench/CMakeLists.txt.
if(TARGET meshrun::coordinator::service)
  add_executable(meshrun_fanout_bench ${CMAKE_CURRENT_LIST_DIR}/fanout_bench.cc)
  target_link_libraries(meshrun_fanout_bench PRIVATE
    meshrun::coordinator::service meshrun::worker::service meshrun::proto gRPC::grpc++ absl::time
    absl::synchronization)
endif()
