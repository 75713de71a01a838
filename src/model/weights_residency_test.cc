// A middle shard's resident memory holds only its layers.
//
// A 12-layer synthetic model (~2.5 MiB per layer, ~31 MiB in all) is written
// to a temporary file and opened with GgufFile::Open (mmap, MADV_RANDOM). A
// middle shard loads layers 4-7, then reads every byte of its weights. The
// file mapping's resident set is measured twice, independently:
//  - /proc/self/smaps: the Rss of the file's mapping, in bytes;
//  - /proc/self/pagemap: which pages of the mapping are present, so we can say
//    WHERE the resident bytes are, not only how many.
//
// The bound. Reading a page of a file mapping makes the kernel map that page
// plus neighbours already in the page cache ("fault-around": fault_around_bytes,
// 64 KiB by default; newer kernels may map whole large folios). MADV_RANDOM
// turns off readahead, not fault-around. Rather than guess that window, the
// test measures it: it maps the same (freshly written, so fully cached: the
// worst case) file a second time, touches ONE byte and reads that mapping's
// Rss: W. Then a read of the owned byte range [lo, hi) can map at most W beyond
// each end, and nothing else may appear:
//     owned <= resident - resident_after_open <= (hi - lo) + 2 * W
//     every present page was present after Open (header) or lies in [lo - W, hi + W)
// W is also required to be at most 2 MiB (a PMD), so a kernel that mapped
// everything cannot make the bound vacuous; with 2.5 MiB layers even 2 * W is
// under two layers, and a shard that read one foreign layer fails. (On the
// machine this was written on W = 64 KiB: 2 * W is 5% of one layer.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/synthetic_model.h"
#include "model/weights.h"

namespace meshnet::model {
namespace {

constexpr uint64_t kMaxWindow = 2u << 20;

struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  uint64_t file_offset = 0;
  uint64_t rss_bytes = 0;
};

// The mapping of `path` that contains `addr`, from /proc/self/smaps.
Mapping FindMapping(const std::string& path, const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  Mapping found;
  int matches = 0;
  bool in_target = false;
  while (std::getline(smaps, line)) {
    unsigned long start, end, offset;
    char perms[8], dev[16];
    unsigned long inode;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %15s %lu %n", &start, &end, perms, &offset, dev,
                    &inode, &consumed) == 6) {
      std::string name = line.substr(static_cast<size_t>(consumed));
      in_target = name == path && start <= a && a < end;
      if (in_target) {
        ++matches;
        found = Mapping{start, end, offset, 0};
      }
      continue;
    }
    unsigned long kb;
    if (in_target && std::sscanf(line.c_str(), "Rss: %lu kB", &kb) == 1)
      found.rss_bytes = kb * 1024;
  }
  EXPECT_EQ(matches, 1) << "mapping of " << path << " at " << addr;
  return found;
}

// One flag per page of `m`: present in this process's page tables.
std::vector<bool> PresentPages(const Mapping& m, uint64_t page) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  EXPECT_GE(fd, 0);
  const size_t n = (m.end - m.start) / page;
  std::vector<uint64_t> entries(n);
  const ssize_t got = ::pread(fd, entries.data(), n * 8, static_cast<off_t>(m.start / page * 8));
  ::close(fd);
  EXPECT_EQ(got, static_cast<ssize_t>(n * 8));
  std::vector<bool> present(n);
  for (size_t i = 0; i < n; ++i) present[i] = (entries[i] >> 63) & 1;
  return present;
}

// The bytes the kernel maps when one byte in the middle of `path` is read
// through a fresh MADV_RANDOM mapping: its fault-around window.
uint64_t FaultWindow(const std::string& path, uint64_t size, uint64_t page) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  EXPECT_NE(p, MAP_FAILED);
  ::madvise(p, size, MADV_RANDOM);
  const volatile uint8_t* bytes = static_cast<const uint8_t*>(p);
  const uint8_t x = bytes[size / 2 / page * page + page / 2];
  (void)x;
  const uint64_t window = FindMapping(path, p).rss_bytes;
  ::munmap(p, size);
  return window;
}

class TempFile {
 public:
  TempFile() {
    const char* dir = std::getenv("TMPDIR");
    std::string templ = std::string(dir && *dir ? dir : "/tmp") + "/meshnet_residency_XXXXXX";
    const int fd = ::mkstemp(templ.data());
    EXPECT_GE(fd, 0);
    ::close(fd);
    char resolved[PATH_MAX];
    path_ = ::realpath(templ.c_str(), resolved) ? resolved : templ;
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(WeightsResidency, MiddleShardFaultsInOnlyItsLayers) {
  SyntheticLlamaSpec spec;
  spec.n_layers = 12;
  spec.n_embd = 256;
  spec.n_heads = 8;
  spec.n_kv_heads = 8;
  spec.n_ff = 512;
  spec.vocab_size = 512;
  TempFile tmp;
  SyntheticLlamaWriter(spec).WriteFile(tmp.path());

  const gguf::GgufFile file = gguf::GgufFile::Open(tmp.path());  // MADV_RANDOM
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const void* mapped = file.tensors().front().data;
  const uint64_t window = FaultWindow(tmp.path(), file.file_size(), page);
  ASSERT_GE(window, page);
  ASSERT_LE(window, kMaxWindow);

  const Mapping before = FindMapping(tmp.path(), mapped);
  ASSERT_EQ(before.file_offset, 0u);
  ASSERT_GE(before.end - before.start, file.file_size());

  const LlamaWeights w = LlamaWeights::Load(file, hp, 4, 7);
  ASSERT_FALSE(w.is_head());
  ASSERT_FALSE(w.is_tail());
  // Loading reads only the tensor table: no tensor page was faulted in.
  EXPECT_EQ(FindMapping(tmp.path(), mapped).rss_bytes, before.rss_bytes);
  const std::vector<bool> present_before = PresentPages(before, page);

  // The owned tensors form one byte range of the file (layers are contiguous).
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const gguf::TensorInfo* t : w.owned_tensors()) {
    lo = std::min(lo, t->offset);
    hi = std::max(hi, t->offset + t->n_bytes);
  }
  ASSERT_LT(hi - lo, w.owned_bytes() + 36 * file.alignment());  // only alignment padding between

  // Read every byte of the owned weights.
  uint64_t sum = 0;
  for (const gguf::TensorInfo* t : w.owned_tensors()) {
    const auto* p = static_cast<const uint8_t*>(t->data);
    for (uint64_t i = 0; i < t->n_bytes; ++i) sum += p[i];
  }
  EXPECT_GT(sum, 0u);

  const Mapping after = FindMapping(tmp.path(), mapped);
  const uint64_t layer_bytes = w.owned_bytes() / 4;
  const uint64_t span = (hi + page - 1) / page * page - lo / page * page;  // owned pages
  const auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf(
      "file %.2f MiB, 4 of 12 layers owned: %.2f MiB (%.2f MiB per layer); "
      "fault window %.0f KiB; resident after Open %.0f KiB, after reading the shard "
      "%.2f MiB = owned + %.0f KiB\n",
      mib(file.file_size()), mib(w.owned_bytes()), mib(layer_bytes), mib(window) * 1024,
      mib(before.rss_bytes) * 1024, mib(after.rss_bytes),
      (mib(after.rss_bytes - before.rss_bytes) - mib(w.owned_bytes())) * 1024);
  EXPECT_GE(after.rss_bytes - before.rss_bytes, w.owned_bytes());
  EXPECT_LE(after.rss_bytes - before.rss_bytes, span + 2 * window);
  EXPECT_LT(after.rss_bytes, file.file_size() / 2);

  // Where: every present page was present after Open or lies within one
  // window of the owned range.
  const std::vector<bool> present = PresentPages(after, page);
  uint64_t present_bytes = 0, stray_pages = 0;
  for (size_t i = 0; i < present.size(); ++i) {
    if (!present[i]) continue;
    present_bytes += page;
    const uint64_t off = i * page;
    const bool near_owned = off + page + window > lo && off < hi + window;
    if (!present_before[i] && !near_owned) {
      if (++stray_pages <= 5) {
        ADD_FAILURE() << "page at file offset " << off << " is resident, owned range [" << lo
                      << ", " << hi << ")";
      }
    }
  }
  EXPECT_EQ(stray_pages, 0u);
  EXPECT_EQ(present_bytes, after.rss_bytes);  // the two measurements agree
}

}  // namespace
}  // namespace meshnet::model
