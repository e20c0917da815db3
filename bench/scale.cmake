# Scale benchmark: one coordinator, 16 to 1024 stand-in TPU hosts (testing/fake_fleet.h),
# registration, heartbeats, one launch across every host and its telemetry. Included from
# bench/CMakeLists.txt.
if(TARGET meshrun::testing::scale)
  add_executable(meshrun_scale_bench ${CMAKE_CURRENT_LIST_DIR}/scale_bench.cc)
  target_link_libraries(meshrun_scale_bench PRIVATE meshrun::testing::scale absl::flags
    absl::flags_parse absl::strings)
endif()
