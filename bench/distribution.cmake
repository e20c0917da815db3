# Distribution benchmark: a 256 MiB executable from the coordinator's cache to 2 in-process
# WorkerServers (LoadExecutable: 1 MiB chunks, sha256, store) vs a plain gRPC client stream of the
# same bytes to a discarding server. Included from bench/CMakeLists.txt.
if(TARGET meshrun::coordinator::service)
  add_executable(meshrun_distribution_bench ${CMAKE_CURRENT_LIST_DIR}/distribution_bench.cc)
  target_link_libraries(meshrun_distribution_bench PRIVATE
    meshrun::coordinator::service meshrun::worker::service meshrun::coordinator meshrun::proto
    gRPC::grpc++ spdlog::spdlog absl::time)
endif()
