// The coordinator's key-value store and barriers (coordinator/key_value_store.h) on any
// sequence of calls. Each input line is one call, its fields split on spaces and C-unescaped
// ("\n", "\x00" reach every byte):
//   set KEY VALUE [overwrite]   get KEY   wait KEY   list DIR   del KEY
//   barrier ID TASK TASK1,TASK2,...
// against a fresh store with small quotas (1 KiB values, 64 keys). Seeds: the rendezvous a
// two-host job's PJRT clients do (topology keys, a barrier) and a quota overflow. Property: no
// crash; each refusal is a documented code; a value read back is the value set; every waiter is
// answered exactly once (at the latest with CANCELLED when the store goes).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "coordinator/key_value_store.h"
#include "fuzz/fuzz_support.h"

namespace {
using namespace meshrun;
using Code = absl::StatusCode;

struct Answers {
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  int answered_twice ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::QuietLogs();
  fuzz::MaybeWriteSeeds({
      "set job-1/topology/0 host-a:devices=4\nset job-1/topology/1 host-b:devices=4\n"
      "get job-1/topology/0\nlist job-1/topology\nbarrier job-1/init 0 0,1\n"
      "barrier job-1/init 1 0,1\ndel job-1/\nget job-1/topology/1\n",
      "wait a/b\nset a/b v\nset a/b w\nset a/b w overwrite\nbarrier b 2 0,1\nbarrier b 0 0,1,2\n",
      "set k \\x00\\xff\nset k/ v\nset  v\ndel nothing\nlist \nbarrier  0 0\n",
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto created = coordinator::KeyValueStore::Create({.max_value_bytes = 1024, .max_keys = 64});
  if (!created.ok()) __builtin_trap();
  std::unique_ptr<coordinator::KeyValueStore> store = std::move(*created);
  auto answers = std::make_shared<Answers>();
  auto expect_once = [answers]() {
    {
      absl::MutexLock l(&answers->mu);
      ++answers->pending;
    }
    auto called = std::make_shared<std::atomic<bool>>(false);
    return [answers, called]() {
      absl::MutexLock l(&answers->mu);
      if (called->exchange(true)) ++answers->answered_twice;
      --answers->pending;
    };
  };
  std::map<std::string, std::string> model;  // what each successful set/del leaves
  int lines = 0;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), '\n')) {
    if (++lines > 256) break;
    std::vector<std::string> f;
    for (absl::string_view raw : absl::StrSplit(line, ' ')) {
      std::string field;
      if (!absl::CUnescape(raw, &field)) field = std::string(raw);
      f.push_back(std::move(field));
    }
    const std::string& op = f[0];
    const std::string arg = f.size() > 1 ? f[1] : "";
    if (op == "set" && f.size() >= 3) {
      const bool overwrite = f.size() > 3 && f[3] == "overwrite";
      const absl::Status s = store->Set(arg, f[2], overwrite);
      fuzz::ExpectDocumentedError(s, "Set", {Code::kInvalidArgument, Code::kAlreadyExists,
                                             Code::kResourceExhausted});
      if (s.ok()) model[arg] = f[2];
    } else if (op == "get") {
      const absl::StatusOr<std::string> v = store->TryGet(arg);
      fuzz::ExpectDocumentedError(v.status(), "TryGet", {Code::kNotFound, Code::kInvalidArgument});
      const auto it = model.find(arg);
      if (v.ok() != (it != model.end()) || (v.ok() && *v != it->second)) __builtin_trap();
    } else if (op == "wait") {
      auto done = expect_once();
      store->GetAsync(arg, absl::Now() + absl::Milliseconds(1),
                      [done](absl::StatusOr<std::string> v) {
                        fuzz::ExpectDocumentedError(
                            v.status(), "GetAsync",
                            {Code::kInvalidArgument, Code::kDeadlineExceeded, Code::kCancelled});
                        done();
                      });
    } else if (op == "list") {
      for (const auto& [key, value] : store->List(arg)) {
        const auto it = model.find(key);
        if (it == model.end() || it->second != value) __builtin_trap();
      }
    } else if (op == "del") {
      const absl::Status s = store->Delete(arg);
      fuzz::ExpectDocumentedError(s, "Delete", {Code::kInvalidArgument, Code::kNotFound});
      if (s.ok() && !arg.empty() && arg.back() == '/') {
        for (auto it = model.lower_bound(arg); it != model.end() && it->first.rfind(arg, 0) == 0;)
          it = model.erase(it);
      } else if (s.ok()) {
        model.erase(arg);
      }
    } else if (op == "barrier" && f.size() >= 4) {
      std::vector<std::string> tasks = absl::StrSplit(f[3], ',');
      auto done = expect_once();
      store->WaitAtBarrier(arg, f[2], tasks, absl::Now() + absl::Milliseconds(1),
                           [done](absl::Status s) {
                             fuzz::ExpectDocumentedError(
                                 s, "WaitAtBarrier",
                                 {Code::kInvalidArgument, Code::kDeadlineExceeded,
                                  Code::kCancelled});
                             done();
                           });
    }
  }
  store.reset();  // answers every waiter still pending with CANCELLED
  absl::MutexLock l(&answers->mu);
  if (answers->pending != 0 || answers->answered_twice != 0) __builtin_trap();
  return 0;
}
