#include "telemetry/step_combiner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace meshrun::telemetry {
namespace {

using Outcome = StepCombiner::AddOutcome;

v1::TelemetryDeclaration Decl(const std::string& name, v1::Combine combine,
                              std::vector<int64_t> shape = {}) {
  v1::TelemetryDeclaration decl;
  decl.set_name(name);
  decl.set_combine(combine);
  for (int64_t dim : shape) decl.add_shape(dim);
  return decl;
}

struct Value {
  std::string name;
  std::vector<float> values;
  std::vector<int64_t> shape = {};
  bool exceeded = false;
};

v1::HostSummary Summary(const std::string& host, int64_t step, std::vector<Value> values,
                        double step_time = 1.0, const std::string& job = "job-1") {
  v1::HostSummary summary;
  summary.set_job_id(job);
  summary.set_step(step);
  summary.set_host(host);
  summary.set_step_time_seconds(step_time);
  summary.set_wall_time_unix_micros(1000 + step);
  for (const Value& v : values) {
    v1::TelemetryValue* out = summary.add_values();
    out->set_name(v.name);
    for (int64_t dim : v.shape) out->add_shape(dim);
    for (float f : v.values) out->add_values(f);
    out->set_threshold_exceeded(v.exceeded);
  }
  return summary;
}

std::vector<float> Values(const v1::TelemetryValue& value) {
  return {value.values().begin(), value.values().end()};
}

class StepCombinerTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(absl::Seconds(5), 1024); }

  void Make(absl::Duration grace, int max_pending) {
    StepCombiner::Config config;
    config.grace = grace;
    config.max_pending_steps = max_pending;
    config.clock = &clock_;
    config.sink = [this](v1::GlobalSummary global) {
      absl::MutexLock l(&mu_);
      emitted_.push_back(std::move(global));
    };
    combiner_ = StepCombiner::Create(std::move(config)).value();
  }

  // Hosts a (1 replica), b (2 replicas), c (3 replicas); a scalar "loss" (mean).
  void StartSimpleJob(int64_t emitted_through = 0) {
    StepCombiner::JobSetup setup;
    setup.job_id = "job-1";
    setup.hosts = {{"a", 1}, {"b", 2}, {"c", 3}};
    setup.declarations = {Decl("loss", v1::COMBINE_MEAN)};
    setup.emitted_through_step = emitted_through;
    ASSERT_TRUE(combiner_->StartJob(setup).ok());
  }

  std::vector<v1::GlobalSummary> Emitted() {
    absl::MutexLock l(&mu_);
    return emitted_;
  }

  FakeClock clock_;
  std::unique_ptr<StepCombiner> combiner_;
  absl::Mutex mu_;
  std::vector<v1::GlobalSummary> emitted_ ABSL_GUARDED_BY(mu_);
};

TEST_F(StepCombinerTest, CombinesEachSemanticsWithReplicaWeights) {
  StepCombiner::JobSetup setup;
  setup.job_id = "job-1";
  setup.hosts = {{"a", 1}, {"b", 2}, {"c", 3}};
  setup.declarations = {Decl("loss", v1::COMBINE_MEAN), Decl("grad_max", v1::COMBINE_MAX),
                        Decl("grad_min", v1::COMBINE_MIN), Decl("tokens", v1::COMBINE_SUM),
                        Decl("lr", v1::COMBINE_LAST), Decl("sink", v1::COMBINE_MEAN, {2})};
  ASSERT_TRUE(combiner_->StartJob(setup).ok());
  auto values = [](float loss, float g, float tokens, float lr, float s0, float s1,
                   bool exceeded) {
    return std::vector<Value>{{"loss", {loss}},      {"grad_max", {g}}, {"grad_min", {g}},
                              {"tokens", {tokens}},  {"lr", {lr}},
                              {"sink", {s0, s1}, {2}, exceeded}};
  };
  // Arrival order differs from host order: kLast must follow host order, not arrival.
  auto c = Summary("c", 10, values(4, 7, 300, 0.3f, 4, 40, false), 1.5);
  c.set_replica_count(3);
  auto a = Summary("a", 10, values(1, 9, 100, 0.1f, 1, 10, true), 2.5);
  a.set_synthetic_data(true);
  auto b = Summary("b", 10, values(2, -1, 200, 0.2f, 2, 20, false), 0.5);
  EXPECT_EQ(combiner_->Add(c).value(), Outcome::kAccepted);
  EXPECT_EQ(combiner_->Add(a).value(), Outcome::kAccepted);
  EXPECT_TRUE(Emitted().empty());
  EXPECT_EQ(combiner_->Add(b).value(), Outcome::kAccepted);

  const auto emitted = Emitted();
  ASSERT_EQ(emitted.size(), 1u);
  const v1::GlobalSummary& g = emitted[0];
  EXPECT_EQ(g.job_id(), "job-1");
  EXPECT_EQ(g.step(), 10);
  EXPECT_FALSE(g.partial());
  EXPECT_TRUE(g.missing_hosts().empty());
  EXPECT_DOUBLE_EQ(g.step_time_seconds(), 2.5);  // max over hosts
  EXPECT_EQ(g.wall_time_unix_micros(), 1010);
  EXPECT_TRUE(g.synthetic_data());  // any host on synthetic data marks the step
  ASSERT_EQ(g.values_size(), 6);
  // mean weighted by replicas: (1*1 + 2*2 + 4*3) / 6
  EXPECT_EQ(g.values(0).name(), "loss");
  EXPECT_FLOAT_EQ(g.values(0).values(0), 17.0f / 6);
  EXPECT_EQ(Values(g.values(1)), std::vector<float>{9});
  EXPECT_EQ(Values(g.values(2)), std::vector<float>{-1});
  EXPECT_EQ(Values(g.values(3)), std::vector<float>{600});
  EXPECT_EQ(Values(g.values(4)), std::vector<float>{0.3f});  // host c has the highest index
  EXPECT_EQ(g.values(5).name(), "sink");
  EXPECT_EQ(std::vector<int64_t>(g.values(5).shape().begin(), g.values(5).shape().end()),
            std::vector<int64_t>{2});
  EXPECT_FLOAT_EQ(g.values(5).values(0), (1 + 4 + 12) / 6.0f);
  EXPECT_FLOAT_EQ(g.values(5).values(1), (10 + 40 + 120) / 6.0f);
  EXPECT_TRUE(g.values(5).threshold_exceeded());
  EXPECT_FALSE(g.values(0).threshold_exceeded());
  // Per-host detail, in host order.
  ASSERT_EQ(g.host_detail_size(), 3);
  EXPECT_EQ(g.host_detail(0).host(), "a");
  EXPECT_EQ(g.host_detail(1).host(), "b");
  EXPECT_EQ(g.host_detail(2).host(), "c");
  EXPECT_EQ(combiner_->LastEmittedStep("job-1").value(), 10);
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 0);
}

TEST_F(StepCombinerTest, PartialAfterGraceNamesMissingHosts) {
  StartSimpleJob();
  const absl::Time start = clock_.Now();
  ASSERT_TRUE(combiner_->Add(Summary("a", 5, {{"loss", {1}}}, 1.0)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(combiner_->Add(Summary("c", 5, {{"loss", {4}}}, 3.0)).ok());
  // The deadline runs from the first host's summary, not the latest.
  EXPECT_EQ(combiner_->NextDeadline(), start + absl::Seconds(5));
  clock_.Advance(absl::Milliseconds(2999));
  combiner_->Poll();
  EXPECT_TRUE(Emitted().empty());
  clock_.Advance(absl::Milliseconds(1));
  combiner_->Poll();
  auto emitted = Emitted();
  ASSERT_EQ(emitted.size(), 1u);
  EXPECT_TRUE(emitted[0].partial());
  EXPECT_EQ(std::vector<std::string>(emitted[0].missing_hosts().begin(),
                                     emitted[0].missing_hosts().end()),
            std::vector<std::string>{"b"});
  // The mean is over the hosts that reported, weighted by their replicas: (1 + 4*3) / 4.
  EXPECT_FLOAT_EQ(emitted[0].values(0).values(0), 13.0f / 4);
  EXPECT_DOUBLE_EQ(emitted[0].step_time_seconds(), 3.0);
  EXPECT_EQ(emitted[0].host_detail_size(), 2);
  EXPECT_FALSE(combiner_->NextDeadline().has_value());

  // The missing host shows up late: ignored, nothing re-emitted.
  EXPECT_EQ(combiner_->Add(Summary("b", 5, {{"loss", {2}}})).value(), Outcome::kLate);
  // A host that did report resending: a duplicate.
  EXPECT_EQ(combiner_->Add(Summary("a", 5, {{"loss", {1}}})).value(), Outcome::kDuplicate);
  combiner_->Poll();
  EXPECT_EQ(Emitted().size(), 1u);
}

TEST_F(StepCombinerTest, EmitsInStepOrder) {
  StartSimpleJob();
  ASSERT_TRUE(combiner_->Add(Summary("a", 10, {{"loss", {1}}})).ok());
  for (const char* host : {"a", "b", "c"}) {
    ASSERT_TRUE(combiner_->Add(Summary(host, 20, {{"loss", {2}}})).ok());
  }
  EXPECT_TRUE(Emitted().empty());  // 20 is complete but waits for 10
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 2);
  ASSERT_TRUE(combiner_->Add(Summary("b", 10, {{"loss", {1}}})).ok());
  ASSERT_TRUE(combiner_->Add(Summary("c", 10, {{"loss", {1}}})).ok());
  auto emitted = Emitted();
  ASSERT_EQ(emitted.size(), 2u);
  EXPECT_EQ(emitted[0].step(), 10);
  EXPECT_EQ(emitted[1].step(), 20);
  EXPECT_FALSE(emitted[0].partial());
  EXPECT_FALSE(emitted[1].partial());

  // An expired earlier step releases the complete later one behind it, in order.
  ASSERT_TRUE(combiner_->Add(Summary("a", 30, {{"loss", {3}}})).ok());
  for (const char* host : {"a", "b", "c"}) {
    ASSERT_TRUE(combiner_->Add(Summary(host, 40, {{"loss", {4}}})).ok());
  }
  clock_.Advance(absl::Seconds(5));
  combiner_->Poll();
  emitted = Emitted();
  ASSERT_EQ(emitted.size(), 4u);
  EXPECT_EQ(emitted[2].step(), 30);
  EXPECT_TRUE(emitted[2].partial());
  EXPECT_EQ(emitted[3].step(), 40);
  EXPECT_FALSE(emitted[3].partial());
}

TEST_F(StepCombinerTest, RateAndMfuFromTheCompilersFlopsOverTheSlowestHost) {
  StepCombiner::JobSetup setup;
  setup.job_id = "job-1";
  setup.hosts = {{"a", 1}, {"b", 1}};
  setup.declarations = {Decl("loss", v1::COMBINE_MEAN)};
  setup.step_flops_per_device = 459e12;  // half a v6e chip's peak for one second
  setup.peak_flops_per_device = 918e12;
  ASSERT_TRUE(combiner_->StartJob(setup).ok());
  ASSERT_TRUE(combiner_->Add(Summary("a", 1, {{"loss", {1}}}, /*step_time=*/0.5)).ok());
  ASSERT_TRUE(combiner_->Add(Summary("b", 1, {{"loss", {1}}}, /*step_time=*/2.0)).ok());
  std::vector<v1::GlobalSummary> emitted = Emitted();
  ASSERT_EQ(emitted.size(), 1u);
  EXPECT_DOUBLE_EQ(emitted[0].tflops_per_device(), 229.5);  // over b's 2 s, the step's time
  EXPECT_DOUBLE_EQ(emitted[0].mfu(), 0.25);

  // Without FLOPs (compiled on a worker) neither is claimed; without a peak (CPU), no MFU.
  setup.job_id = "job-2";
  setup.step_flops_per_device = 0;
  ASSERT_TRUE(combiner_->StartJob(setup).ok());
  setup.job_id = "job-3";
  setup.step_flops_per_device = 1e12;
  setup.peak_flops_per_device = 0;
  ASSERT_TRUE(combiner_->StartJob(setup).ok());
  for (const char* job : {"job-2", "job-3"}) {
    for (const char* host : {"a", "b"}) {
      ASSERT_TRUE(combiner_->Add(Summary(host, 1, {{"loss", {1}}}, 1.0, job)).ok());
    }
  }
  emitted = Emitted();
  ASSERT_EQ(emitted.size(), 3u);
  EXPECT_EQ(emitted[1].tflops_per_device(), 0);
  EXPECT_EQ(emitted[1].mfu(), 0);
  EXPECT_DOUBLE_EQ(emitted[2].tflops_per_device(), 1.0);
  EXPECT_EQ(emitted[2].mfu(), 0);
}

TEST_F(StepCombinerTest, DuplicatesAreIgnoredIdempotently) {
  StartSimpleJob();
  const auto a = Summary("a", 7, {{"loss", {1}}});
  EXPECT_EQ(combiner_->Add(a).value(), Outcome::kAccepted);
  // A reconnecting worker resends its buffer, with different contents even: the first wins.
  EXPECT_EQ(combiner_->Add(Summary("a", 7, {{"loss", {100}}})).value(), Outcome::kDuplicate);
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 1);
  ASSERT_TRUE(combiner_->Add(Summary("b", 7, {{"loss", {1}}})).ok());
  ASSERT_TRUE(combiner_->Add(Summary("c", 7, {{"loss", {1}}})).ok());
  ASSERT_EQ(Emitted().size(), 1u);
  EXPECT_FLOAT_EQ(Emitted()[0].values(0).values(0), 1.0f);
  for (const char* host : {"a", "b", "c"}) {
    EXPECT_EQ(combiner_->Add(Summary(host, 7, {{"loss", {1}}})).value(), Outcome::kDuplicate);
  }
  EXPECT_EQ(Emitted().size(), 1u);
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 0);
}

TEST_F(StepCombinerTest, RefusesBadSummariesWithStateUnchanged) {
  StepCombiner::JobSetup setup;
  setup.job_id = "job-1";
  setup.hosts = {{"a", 1}, {"b", 2}};
  setup.declarations = {Decl("loss", v1::COMBINE_MEAN), Decl("sink", v1::COMBINE_MAX, {2})};
  ASSERT_TRUE(combiner_->StartJob(setup).ok());
  const std::vector<Value> good = {{"loss", {1}}, {"sink", {1, 2}, {2}}};

  auto unknown_job = Summary("a", 1, good, 1.0, "job-9");
  EXPECT_EQ(combiner_->Add(unknown_job).status().code(), absl::StatusCode::kNotFound);

  struct Case {
    v1::HostSummary summary;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({Summary("z", 1, good), "host"});
  cases.push_back({Summary("a", 0, good), "step"});
  cases.push_back({Summary("a", 1, {{"loss", {1}}, {"sink", {1, 2}, {2}}, {"extra", {1}}}),
                   "values[2].name"});
  cases.push_back({Summary("a", 1, {{"loss", {1}}, {"sink", {1, 2}, {3}}}), "values[1].shape"});
  cases.push_back({Summary("a", 1, {{"loss", {1}}, {"sink", {1, 2, 3}, {2}}}),
                   "values[1].values"});
  cases.push_back({Summary("a", 1, {{"loss", {1}}}), "\"sink\" is missing"});
  cases.push_back({Summary("a", 1, {{"loss", {1}}, {"loss", {1}}, {"sink", {1, 2}, {2}}}),
                   "values[1].name"});
  cases.push_back({Summary("a", 1, good, -1.0), "step_time_seconds"});
  auto replicas = Summary("b", 1, good);
  replicas.set_replica_count(5);
  cases.push_back({replicas, "replica_count"});
  for (const Case& c : cases) {
    auto outcome = combiner_->Add(c.summary);
    EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(outcome.status().message().find(c.field), absl::string_view::npos)
        << outcome.status().message() << " should name " << c.field;
  }
  // Nothing was kept: no pending step, no deadline, and a good pair still completes.
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 0);
  EXPECT_FALSE(combiner_->NextDeadline().has_value());
  EXPECT_EQ(combiner_->Add(Summary("a", 1, good)).value(), Outcome::kAccepted);
  EXPECT_EQ(combiner_->Add(Summary("b", 1, good)).value(), Outcome::kAccepted);
  ASSERT_EQ(Emitted().size(), 1u);
  EXPECT_FALSE(Emitted()[0].partial());
}

TEST_F(StepCombinerTest, StartJobValidates) {
  StepCombiner::JobSetup setup;
  setup.job_id = "job-1";
  setup.hosts = {{"a", 1}};
  setup.declarations = {Decl("loss", v1::COMBINE_UNSPECIFIED)};
  auto status = combiner_->StartJob(setup);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("telemetry[0].combine"), absl::string_view::npos) << status;
  setup.declarations = {Decl("loss", v1::COMBINE_MEAN), Decl("loss", v1::COMBINE_MAX)};
  EXPECT_EQ(combiner_->StartJob(setup).code(), absl::StatusCode::kInvalidArgument);
  setup.declarations = {Decl("v", v1::COMBINE_MEAN, {2, -1})};
  EXPECT_EQ(combiner_->StartJob(setup).code(), absl::StatusCode::kInvalidArgument);
  setup.declarations = {Decl("loss", v1::COMBINE_MEAN)};
  setup.hosts = {{"a", 1}, {"a", 1}};
  EXPECT_EQ(combiner_->StartJob(setup).code(), absl::StatusCode::kInvalidArgument);
  setup.hosts = {{"a", 0}};
  EXPECT_EQ(combiner_->StartJob(setup).code(), absl::StatusCode::kInvalidArgument);
  setup.hosts = {};
  EXPECT_EQ(combiner_->StartJob(setup).code(), absl::StatusCode::kInvalidArgument);
  setup.hosts = {{"a", 1}};
  EXPECT_TRUE(combiner_->StartJob(setup).ok());
  EXPECT_EQ(combiner_->StartJob(setup).code(), absl::StatusCode::kAlreadyExists);

  StepCombiner::Config config;
  config.clock = &clock_;
  EXPECT_EQ(StepCombiner::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StepCombinerTest, FinishJobFlushesPendingAsPartial) {
  StartSimpleJob();
  ASSERT_TRUE(combiner_->Add(Summary("a", 1, {{"loss", {1}}})).ok());
  ASSERT_TRUE(combiner_->Add(Summary("b", 2, {{"loss", {1}}})).ok());
  ASSERT_TRUE(combiner_->FinishJob("job-1").ok());
  auto emitted = Emitted();
  ASSERT_EQ(emitted.size(), 2u);
  EXPECT_EQ(emitted[0].step(), 1);
  EXPECT_TRUE(emitted[0].partial());
  EXPECT_EQ(emitted[0].missing_hosts_size(), 2);
  EXPECT_EQ(emitted[1].step(), 2);
  EXPECT_EQ(combiner_->Add(Summary("c", 1, {{"loss", {1}}})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(combiner_->FinishJob("job-1").code(), absl::StatusCode::kNotFound);
}

TEST_F(StepCombinerTest, BoundsPendingStepsByForcingTheOldestOut) {
  Make(absl::Seconds(5), 3);
  StartSimpleJob();
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(combiner_->Add(Summary("a", step, {{"loss", {1}}})).ok());
  }
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 3);
  auto emitted = Emitted();
  ASSERT_EQ(emitted.size(), 2u);
  EXPECT_EQ(emitted[0].step(), 1);
  EXPECT_EQ(emitted[1].step(), 2);
  EXPECT_TRUE(emitted[1].partial());
}

TEST_F(StepCombinerTest, RestartSkipsStepsAlreadyInHistory) {
  StartSimpleJob(/*emitted_through=*/10);
  EXPECT_EQ(combiner_->Add(Summary("a", 10, {{"loss", {1}}})).value(), Outcome::kDuplicate);
  EXPECT_EQ(combiner_->Add(Summary("a", 20, {{"loss", {1}}})).value(), Outcome::kAccepted);
  EXPECT_EQ(combiner_->PendingSteps("job-1").value(), 1);
  EXPECT_TRUE(Emitted().empty());
}

TEST_F(StepCombinerTest, SinkMayCallBackIntoTheCombiner) {
  std::vector<int64_t> seen;
  StepCombiner* self = nullptr;
  StepCombiner::Config config;
  config.clock = &clock_;
  config.sink = [&](v1::GlobalSummary global) {
    seen.push_back(global.step());
    EXPECT_TRUE(self->LastEmittedStep("job-1").ok());
  };
  auto combiner = StepCombiner::Create(config).value();
  self = combiner.get();
  StepCombiner::JobSetup setup;
  setup.job_id = "job-1";
  setup.hosts = {{"a", 1}};
  setup.declarations = {Decl("loss", v1::COMBINE_MEAN)};
  ASSERT_TRUE(combiner->StartJob(setup).ok());
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(combiner->Add(Summary("a", step, {{"loss", {1}}})).ok());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace meshrun::telemetry
