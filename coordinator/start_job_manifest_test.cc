#include "coordinator/start_job_manifest.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "jobspec/memory_tier.h"

namespace meshrun::coordinator {
namespace {

// A job across `hosts` hosts with every per-host entry the job table keeps, and a history.
v1::JobManifest JobAcross(int hosts) {
  v1::JobManifest job;
  job.set_job_id("job-7");
  job.mutable_spec()->set_steps(100);
  job.mutable_mesh()->add_axis_names("data");
  job.mutable_mesh()->add_shape(2 * hosts);
  (*job.mutable_program_fingerprints())["step"] = "ab12";
  job.mutable_data_receipt()->set_sha256("cd34");
  for (int h = 0; h < hosts; ++h) {
    const std::string host = absl::StrCat("host-", h);
    for (int d = 0; d < 2; ++d) {  // two devices each, in mesh order
      job.mutable_mesh()->add_device_ids(2 * h + d);
      job.mutable_mesh()->add_device_hosts(host);
    }
    (*job.mutable_host_incarnations())[host] = absl::StrCat("incarnation-", h);
    (*job.mutable_host_runtime_versions())[host] = "tpu 0.0.30";
    (*job.mutable_mesh()->mutable_host_slices())[host] = h % 2;
    v1::HostEnvironment* environment = job.mutable_mesh()->add_megascale();
    environment->set_host(host);
    environment->add_variables(absl::StrCat("MEGASCALE_SLICE_ID=", h % 2));
    job.add_straggler_hosts(host);
  }
  for (int run = 0; run < 2; ++run) {
    v1::JobAttempt* attempt = job.add_attempts();
    attempt->set_cause("host-1 lost");
    for (int h = 0; h < hosts; ++h) attempt->add_hosts(absl::StrCat("host-", h));
  }
  job.add_checkpoints()->set_step(50);
  job.mutable_memory_restore()->set_step(40);
  return job;
}

TEST(StartJobManifestsTest, AHostGetsTheSharedPartsAndOnlyItsOwnEntries) {
  const v1::JobManifest job = JobAcross(3);
  const v1::JobManifest sent = StartJobManifests(job).ForHost("host-1");
  EXPECT_EQ(sent.job_id(), "job-7");
  EXPECT_EQ(sent.spec().steps(), 100);
  EXPECT_EQ(sent.mesh().shape(0), 6);
  EXPECT_EQ(sent.program_fingerprints().at("step"), "ab12");
  EXPECT_EQ(sent.data_receipt().sha256(), "cd34");
  EXPECT_EQ(sent.memory_restore().step(), 40);
  ASSERT_EQ(sent.host_incarnations_size(), 1);
  EXPECT_EQ(sent.host_incarnations().at("host-1"), "incarnation-1");
  ASSERT_EQ(sent.host_runtime_versions_size(), 1);
  ASSERT_EQ(sent.mesh().host_slices_size(), 1);
  EXPECT_EQ(sent.mesh().host_slices().at("host-1"), 1);
  ASSERT_EQ(sent.mesh().megascale_size(), 1);
  EXPECT_EQ(sent.mesh().megascale(0).variables(0), "MEGASCALE_SLICE_ID=1");
  // The worker numbers its run by the earlier runs' count; their contents stay here.
  ASSERT_EQ(sent.attempts_size(), 2);
  EXPECT_EQ(sent.attempts(0).hosts_size(), 0);
  EXPECT_EQ(sent.checkpoints_size(), 0);
  EXPECT_EQ(sent.straggler_hosts_size(), 0);
  // A host the job does not name gets the shared parts alone.
  EXPECT_EQ(StartJobManifests(job).ForHost("elsewhere").host_incarnations_size(), 0);
}

TEST(StartJobManifestsTest, AHostsMeshNamesItsDevicesAndItsRingPredecessorsByPosition) {
  const v1::JobManifest job = JobAcross(3);  // devices of host-0, host-1, host-2 in mesh order
  const StartJobManifests manifests(job);
  const v1::MeshAssignment first = manifests.ForHost("host-0").mesh();
  EXPECT_EQ(std::vector<int>(first.partitions().begin(), first.partitions().end()),
            (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(std::vector<int>(first.device_ids().begin(), first.device_ids().end()),
            (std::vector<int>{0, 1, 4, 5}));
  // What the worker reads off it is what it would read off the whole mesh.
  for (const std::string host : {"host-0", "host-1", "host-2"}) {
    const v1::MeshAssignment view = manifests.ForHost(host).mesh();
    EXPECT_EQ(jobspec::PartitionsOf(view, host), jobspec::PartitionsOf(job.mesh(), host)) << host;
    EXPECT_EQ(jobspec::RingPredecessor(view, host), jobspec::RingPredecessor(job.mesh(), host))
        << host;
    EXPECT_EQ(manifests.RingPredecessorOf(host), jobspec::RingPredecessor(job.mesh(), host))
        << host;
  }
  // One host's mesh is sent as it is: there is no ring.
  v1::JobManifest alone = JobAcross(1);
  EXPECT_EQ(StartJobManifests(alone).ForHost("host-0").mesh().device_ids_size(), 2);
  EXPECT_EQ(StartJobManifests(alone).ForHost("host-0").mesh().partitions_size(), 0);
  EXPECT_EQ(StartJobManifests(alone).RingPredecessorOf("host-0"), "");
}

TEST(StartJobManifestsTest, WhatAHostGetsDoesNotGrowWithTheHostCount) {
  // The bytes are the same at 8 and at 1024 hosts but for the digits of the mesh size.
  const size_t small = StartJobManifests(JobAcross(8)).ForHost("host-3").ByteSizeLong();
  v1::JobManifest job = JobAcross(1024);
  std::vector<std::string> hosts;
  for (int i = 0; i < 1024; ++i) hosts.push_back(absl::StrCat("host-", i));
  const std::map<std::string, std::string> relays = AssignTelemetryRelays(hosts, 64);
  job.mutable_telemetry_relays()->insert(relays.begin(), relays.end());  // the job's, not a host's
  const size_t large = StartJobManifests(job).ForHost("host-3").ByteSizeLong();
  EXPECT_LE(large, small + 4);
  EXPECT_LT(large, job.ByteSizeLong() / 100);
}

TEST(AssignTelemetryRelaysTest, EachGroupsFirstHostRelaysTheOthersInMeshOrder) {
  std::vector<std::string> hosts;
  for (int i = 0; i < 10; ++i) hosts.push_back(absl::StrCat("h", 9 - i));  // mesh order
  const std::map<std::string, std::string> relay_of = AssignTelemetryRelays(hosts, 4);
  // Groups {h9 h8 h7 h6} {h5 h4 h3 h2} {h1 h0}: the first of each relays the group's, its own
  // included.
  EXPECT_EQ(relay_of, (std::map<std::string, std::string>{
                          {"h9", "h9"}, {"h8", "h9"}, {"h7", "h9"}, {"h6", "h9"}, {"h5", "h5"},
                          {"h4", "h5"}, {"h3", "h5"}, {"h2", "h5"}, {"h1", "h1"}, {"h0", "h1"}}));
  // No more hosts than a group, or relays off: every host uploads its own.
  EXPECT_TRUE(AssignTelemetryRelays(hosts, 10).empty());
  EXPECT_TRUE(AssignTelemetryRelays(hosts, 0).empty());
  EXPECT_EQ(AssignTelemetryRelays(hosts, 9).at("h0"), "h0");  // {h9..h1}, and h0 alone
}

}  // namespace
}  // namespace meshrun::coordinator
