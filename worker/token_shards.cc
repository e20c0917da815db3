#include "worker/token_shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::worker {
namespace {

// Little-endian reads from a buffer already checked to be long enough.
template <typename T>
T Read(const char* bytes, int64_t offset) {
  T value;
  std::memcpy(&value, bytes + offset, sizeof(T));
  return value;  // x86-64 and aarch64 Linux are little-endian, like the format
}

// Pieces in which Open reads a mapped file before dropping it from the resident set.
constexpr int64_t kPieceBytes = int64_t{64} << 20;

// Drops the pages around [offset, offset + n) of a mapping of `size` bytes from the process's
// resident set (the page cache keeps them; a later read maps them again), widened to whole
// blocks of the kernel's fault-around (64 KiB by default: one fault maps that many pages), so
// reading does not accumulate resident pages.
void DropResident(void* base, int64_t size, int64_t offset, int64_t n) {
  constexpr int64_t kBlock = int64_t{64} << 10;
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t begin = offset / kBlock * kBlock;
  const int64_t end = std::min((offset + n + kBlock - 1) / kBlock * kBlock,
                               (size + page - 1) / page * page);
  if (end > begin) madvise(static_cast<char*>(base) + begin, end - begin, MADV_DONTNEED);
}

struct Shard {
  uint32_t vocab_size = 0;
  uint32_t bos = 0;
  int width = 2;
  int64_t tokens = 0;
  int64_t documents = 0;
};

int64_t TokenAt(const char* tokens, int width, int64_t i) {
  return width == 2 ? Read<uint16_t>(tokens, 2 * i) : Read<uint32_t>(tokens, 4 * i);
}

// Checks the layout of docs/data.md (reading the mapped file in pieces) and appends the shard's
// document starts (stream indices, `base` = tokens of the earlier files).
absl::Status ParseShard(const std::string& path, void* mapped, int64_t size, int64_t base,
                        Shard* shard, std::vector<int64_t>* starts) {
  const char* bytes = static_cast<const char*>(mapped);
  auto bad = [&](const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat("token shard ", path, ": ", problem));
  };
  if (size < kTokenShardHeaderBytes) {
    return bad(absl::StrCat("truncated: ", size, " bytes, the header alone is ",
                            kTokenShardHeaderBytes));
  }
  if (std::memcmp(bytes, kTokenShardMagic, sizeof(kTokenShardMagic)) != 0) {
    return bad("bad magic: not a token shard (write one with examples/make_token_shards.py)");
  }
  const uint32_t version = Read<uint32_t>(bytes, 8);
  if (version < 1 || version > kTokenShardVersion) {
    return bad(absl::StrCat("version ", version, " is not supported (this reader reads 1 to ",
                            kTokenShardVersion, ")"));
  }
  shard->vocab_size = Read<uint32_t>(bytes, 12);
  shard->bos = Read<uint32_t>(bytes, 16);
  const uint32_t width_field = Read<uint32_t>(bytes, 20);
  if (version == 1 && width_field != 0) return bad("reserved header field is not 0");
  if (version == 2 && width_field != 2 && width_field != 4) {
    return bad(absl::StrCat("token width ", width_field, " is not 2 (u16) or 4 (u32)"));
  }
  shard->width = version == 1 ? 2 : static_cast<int>(width_field);
  const uint64_t max_vocab = shard->width == 2 ? uint64_t{65536} : uint64_t{1} << 31;
  const uint64_t num_tokens = Read<uint64_t>(bytes, 24);
  const uint64_t num_documents = Read<uint64_t>(bytes, 32);
  if (shard->vocab_size == 0 || shard->vocab_size > max_vocab || shard->bos >= shard->vocab_size) {
    return bad(absl::StrCat("vocab_size ", shard->vocab_size, " / bos ", shard->bos,
                            " invalid (need bos < vocab_size <= ", max_vocab, " for ",
                            shard->width == 2 ? "u16" : "u32", " tokens)"));
  }
  // Bounded before multiplying, so a corrupt count cannot overflow.
  if (num_tokens > static_cast<uint64_t>(size) || num_documents > static_cast<uint64_t>(size)) {
    return bad(absl::StrCat("truncated: header counts ", num_tokens, " tokens and ",
                            num_documents, " documents, the file has ", size, " bytes"));
  }
  const int64_t token_bytes = shard->width * static_cast<int64_t>(num_tokens);
  const int64_t expected =
      kTokenShardHeaderBytes + token_bytes + 8 * static_cast<int64_t>(num_documents);
  if (size != expected) {
    return bad(absl::StrCat(size < expected ? "truncated" : "trailing bytes", ": ", size,
                            " bytes, the header's counts (", num_tokens, " tokens, ",
                            num_documents, " documents) need ", expected));
  }
  if ((num_tokens == 0) != (num_documents == 0)) {
    return bad("tokens without documents (or documents without tokens)");
  }
  const char* tokens = bytes + kTokenShardHeaderBytes;
  const int64_t piece_tokens = kPieceBytes / shard->width;
  for (int64_t from = 0; from < static_cast<int64_t>(num_tokens); from += piece_tokens) {
    const int64_t to = std::min<int64_t>(from + piece_tokens, static_cast<int64_t>(num_tokens));
    for (int64_t i = from; i < to; ++i) {
      if (const int64_t t = TokenAt(tokens, shard->width, i); t >= shard->vocab_size) {
        return bad(absl::StrCat("token ", i, " is ", t, ", outside vocab_size ",
                                shard->vocab_size));
      }
    }
    DropResident(mapped, size, kTokenShardHeaderBytes + from * shard->width,
                 (to - from) * shard->width);
  }
  const int64_t starts_offset = kTokenShardHeaderBytes + token_bytes;
  int64_t previous = -1;
  for (uint64_t d = 0; d < num_documents; ++d) {
    const uint64_t start = Read<uint64_t>(bytes, starts_offset + 8 * static_cast<int64_t>(d));
    const bool in_order = d == 0 ? start == 0 : static_cast<int64_t>(start) > previous;
    if (!in_order || start >= num_tokens) {
      return bad(absl::StrCat("document ", d, " starts at ", start,
                              ": starts must begin at 0, increase and stay below ", num_tokens));
    }
    if (TokenAt(tokens, shard->width, static_cast<int64_t>(start)) != shard->bos) {
      return bad(absl::StrCat("document ", d, " does not start with the BOS token ", shard->bos));
    }
    previous = static_cast<int64_t>(start);
    starts->push_back(base + previous);
  }
  DropResident(mapped, size, 0, size);
  shard->tokens = static_cast<int64_t>(num_tokens);
  shard->documents = static_cast<int64_t>(num_documents);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) {
  if (pattern.empty()) return absl::InvalidArgumentError("the token shard glob is empty");
  glob_t matches{};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) files.push_back(matches.gl_pathv[i]);
  globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::InvalidArgumentError(absl::StrCat("no file matches \"", pattern,
                                                   "\" (generate shards with "
                                                   "examples/make_token_shards.py)"));
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the files of \"", pattern, "\""));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Maps a whole file read-only. An empty file maps nothing (base nullptr, size 0).
absl::Status MapFile(const std::string& path, void** base, size_t* size) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("token shard ", path, " is not a regular file"));
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot open token shard ", path));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::DataLossError(absl::StrCat("cannot stat token shard ", path));
  }
  *size = static_cast<size_t>(st.st_size);
  *base = nullptr;
  if (*size > 0) {
    void* mapped = mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      close(fd);
      return absl::DataLossError(absl::StrCat("cannot map token shard ", path));
    }
    *base = mapped;
  }
  close(fd);  // the mapping keeps the file
  return absl::OkStatus();
}

}  // namespace

TokenCorpus::~TokenCorpus() {
  for (const MappedShard& shard : shards_) {
    if (shard.base != nullptr) munmap(shard.base, shard.size);
  }
}

absl::StatusOr<std::shared_ptr<const TokenCorpus>> TokenCorpus::Open(const std::string& glob,
                                                                     const PathRoots* roots) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, Glob(glob));
  if (roots != nullptr) {
    for (std::string& file : files) {
      ASSIGN_OR_RETURN(file, roots->Resolve(file, "a match of the token shard glob"));
    }
  }
  std::shared_ptr<TokenCorpus> corpus(new TokenCorpus());
  Sha256 all;
  for (size_t i = 0; i < files.size(); ++i) {
    MappedShard mapped;
    RETURN_IF_ERROR(MapFile(files[i], &mapped.base, &mapped.size));
    corpus->shards_.push_back(mapped);  // unmapped by ~TokenCorpus, also on error
    Shard shard;
    const int64_t size = static_cast<int64_t>(mapped.size);
    RETURN_IF_ERROR(ParseShard(files[i], mapped.base, size, corpus->num_tokens_, &shard,
                               &corpus->starts_));
    if (i == 0) {
      corpus->vocab_size_ = shard.vocab_size;
      corpus->bos_ = shard.bos;
    } else if (shard.vocab_size != corpus->vocab_size_ || shard.bos != corpus->bos_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token shard ", files[i], ": vocab_size ", shard.vocab_size, " / bos ", shard.bos,
          " differ from ", files[0], "'s ", corpus->vocab_size_, " / ", corpus->bos_));
    }
    MappedShard& kept = corpus->shards_.back();
    kept.tokens = static_cast<const char*>(mapped.base) + kTokenShardHeaderBytes;
    kept.width = shard.width;
    kept.first = corpus->num_tokens_;
    kept.count = shard.tokens;
    corpus->num_tokens_ += shard.tokens;
    // The receipt's hashes, in pieces, each dropped from the resident set after hashing.
    Sha256 file;
    for (int64_t from = 0; from < size; from += kPieceBytes) {
      const int64_t n = std::min(kPieceBytes, size - from);
      const absl::string_view piece(static_cast<const char*>(mapped.base) + from,
                                    static_cast<size_t>(n));
      file.Update(piece);
      all.Update(piece);
      DropResident(mapped.base, size, from, n);
    }
    DataReceipt& receipt = corpus->receipt_;
    receipt.files.push_back(files[i]);
    receipt.file_sha256.push_back(file.HexDigest());
    receipt.bytes += size;
    receipt.tokens += shard.tokens;
    receipt.documents += shard.documents;
  }
  corpus->receipt_.sha256 = all.HexDigest();
  return std::shared_ptr<const TokenCorpus>(std::move(corpus));
}

void TokenCorpus::CopyTokens(int64_t begin, int64_t n, int32_t* out) const {
  // The shard holding `begin`: the last one starting at or before it.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), begin,
                             [](int64_t i, const MappedShard& s) { return i < s.first; });
  size_t k = static_cast<size_t>(it - shards_.begin()) - 1;
  int64_t j = 0;
  while (j < n) {
    const MappedShard& shard = shards_[k];
    const int64_t from = begin + j - shard.first;  // within this shard
    const int64_t count = std::min(n - j, shard.count - from);
    for (int64_t t = 0; t < count; ++t) {
      out[j + t] = static_cast<int32_t>(TokenAt(shard.tokens, shard.width, from + t));
    }
    // The window's pages leave the resident set again (the page cache keeps them): a worker's
    // memory stays flat however much of the corpus it reads.
    DropResident(shard.base, static_cast<int64_t>(shard.size),
               kTokenShardHeaderBytes + from * shard.width, count * shard.width);
    j += count;
    ++k;
  }
}

int64_t TokenCorpus::WindowCount(int64_t length) const {
  const int64_t last_start = num_tokens_ - length;
  if (length < 1 || last_start < 0) return 0;
  return std::upper_bound(starts_.begin(), starts_.end(), last_start) - starts_.begin();
}

}  // namespace meshrun::worker
