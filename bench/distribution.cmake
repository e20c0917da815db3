# Distribution benchmark: a 256 MiB executable from the coordinator's cache to 2 in-process
# WorkerServers (LoadExecutable: 1 MiB chunks, CRC-32C, store) vs a plain gRPC client stream of
# the same bytes to a discarding server; with --tls_vs_ceiling 1, the same path with mutual TLS
# against the ceiling of plaintext + the TLS cipher (timed with OpenSSL's EVP API in-process).
# Included from bench/CMakeLists.txt.
if(TARGET meshrun::coordinator::service)
  add_executable(meshrun_distribution_bench ${CMAKE_CURRENT_LIST_DIR}/distribution_bench.cc)
  target_link_libraries(meshrun_distribution_bench PRIVATE
    meshrun::coordinator::service meshrun::worker::service meshrun::coordinator meshrun::proto
    gRPC::grpc++ spdlog::spdlog absl::time OpenSSL::SSL OpenSSL::Crypto)
endif()
