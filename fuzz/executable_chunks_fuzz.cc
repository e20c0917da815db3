// The worker's executable store (worker/executable_store.h) on any sequence of transfer
// chunks, as LoadExecutable feeds it. The first input line is the executable's bytes (C-
// unescaped); each next line one call, fields split on spaces:
//   begin FP TOTAL     (FP "good" = the bytes' sha256; TOTAL "len" = their length)
//   append OFFSET FROM LEN    (bytes [FROM, FROM+LEN) of the executable)
//   commit SHA         (SHA "good" as above)
//   read FP
// Seeds: an example program's first KiB sent as the coordinator sends it (in order, then
// commit), and the same with a gap, an overlap, a lie about the total and a wrong digest.
// Property: no crash; refusals are documented codes; only an upload whose bytes hash to the
// fingerprint is ever readable, and it reads back as those bytes.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "fuzz/fuzz_support.h"
#include "worker/executable_store.h"

namespace {
using namespace meshrun;
using Code = absl::StatusCode;
std::unique_ptr<worker::ExecutableStore>* store = nullptr;

int64_t Number(const std::string& text, int64_t fallback) {
  int64_t v;
  return absl::SimpleAtoi(text, &v) ? v : fallback;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::QuietLogs();
  std::string program = "MLIR";
  for (const std::string& bundle : fuzz::ExampleBundles()) {
    std::ifstream in(bundle.substr(0, bundle.size() - 8) + "step.mlirbc", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!bytes.empty()) program = bytes.substr(0, 1024);
    break;
  }
  const std::string head = absl::CEscape(program) + "\n";
  const std::string n = std::to_string(program.size());
  const std::string half = std::to_string(program.size() / 2);
  fuzz::MaybeWriteSeeds({
      head + "begin good len\nappend 0 0 " + half + "\nappend " + half + " " + half + " " + n +
          "\ncommit good\nread good\n",
      head + "begin good len\nappend 0 0 10\nappend 20 20 10\ncommit good\nread good\n",
      head + "begin good len\nappend 0 0 10\nappend 5 5 " + n + "\ncommit good\n",
      head + "begin good 1\nappend 0 0 " + n + "\ncommit good\nbegin good -1\n",
      head + "begin good len\nappend 0 0 " + n + "\ncommit 00\ncommit good\nread good\n",
  });
  auto created = worker::ExecutableStore::Create(fuzz::ScratchDir("executables"));
  if (!created.ok()) __builtin_trap();
  store = new std::unique_ptr<worker::ExecutableStore>(std::move(*created));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), '\n');
  std::string bytes;
  if (!absl::CUnescape(lines[0], &bytes)) bytes = std::string(lines[0]);
  const std::string good = Sha256Hex(bytes);
  std::unique_ptr<worker::ExecutableStore::Upload> upload;
  for (size_t i = 1; i < lines.size() && i < 64; ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
    f.resize(4);
    for (int k : {1, 2, 3}) {
      if (f[k] == "good") f[k] = good;
      if (f[k] == "len") f[k] = std::to_string(bytes.size());
    }
    if (f[0] == "begin") {
      auto begun = (*store)->Begin(f[1], Number(f[2], 0));
      fuzz::ExpectDocumentedError(begun.status(), "Begin", {Code::kInvalidArgument});
      if (begun.ok()) upload = std::move(*begun);
    } else if (f[0] == "append" && upload != nullptr) {
      const int64_t from = std::clamp<int64_t>(Number(f[2], 0), 0, int64_t(bytes.size()));
      const int64_t len = std::clamp<int64_t>(Number(f[3], 0), 0, int64_t(bytes.size()) - from);
      fuzz::ExpectDocumentedError(upload->Append(Number(f[1], 0), bytes.substr(from, len)),
                                  "Append",
                                  {Code::kInvalidArgument, Code::kFailedPrecondition});
    } else if (f[0] == "commit" && upload != nullptr) {
      const absl::Status s = upload->Commit(f[1]);
      fuzz::ExpectDocumentedError(s, "Commit", {Code::kDataLoss, Code::kFailedPrecondition});
      if (s.ok() && ((*store)->Read(good).value_or("") != bytes || f[1] != good)) {
        std::fprintf(stderr, "fuzz: a committed upload does not read back as its bytes\n");
        __builtin_trap();
      }
    } else if (f[0] == "read") {
      const absl::StatusOr<std::string> read = (*store)->Read(f[1]);
      fuzz::ExpectDocumentedError(read.status(), "Read", {Code::kNotFound});
      if (read.ok() && Sha256Hex(*read) != f[1]) __builtin_trap();
    }
  }
  return 0;
}
