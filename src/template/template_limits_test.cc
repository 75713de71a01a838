// Hostile templates are bounded: sizes are checked without overflow before anything is built,
// every operation pays for the bytes and items it reads, builds or compares (max_work), and a
// render stops when its caller cancels it. Each case would otherwise take gigabytes or minutes;
// here it gets the limit's error (memory is checked through the peak RSS where a regression
// would allocate gigabytes).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <latch>
#include <string>
#include <thread>

#include "template/chat_template.h"

namespace meshnet::jinja {
namespace {

using nlohmann::ordered_json;

long PeakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

// Renders `tmpl` and expects it to fail with an error naming `limit`, with the process' peak
// RSS growing by less than 256 MiB (the largest case, a list at the 2^20-item cap, holds
// ~100 MiB; the regressions these catch took GBs).
void ExpectLimit(const std::string& tmpl, const std::string& limit, ChatTemplateOptions opts = {},
                 const ordered_json& extra = ordered_json::object()) {
  SCOPED_TRACE(tmpl);
  opts.extra_context = extra;
  const long before = PeakRssMiB();
  auto r = RenderChatTemplate(tmpl, ordered_json::array(), opts);
  ASSERT_FALSE(r.ok()) << "rendered " << r.value().size() << " bytes";
  EXPECT_EQ(r.error().kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(r.error().what()).find(limit), std::string::npos) << r.error().what();
  EXPECT_LT(PeakRssMiB() - before, 256);
}

TEST(ChatTemplateLimitsTest, RepeatCountsThatWrapTheSizeCheckAreRefused) {
  // 4 * 2**62 is 0 in 64-bit arithmetic.
  ExpectLimit("{{ 'abcd' * 2**62 }}", "output limit");
  ExpectLimit("{{ 'abcd' * 4611686018427387904 }}", "output limit");
  ExpectLimit("{{ ([1, 2, 3, 4] * 2**62)|length }}", "items");
  ExpectLimit("{{ (2**62 * ('ab'|safe)) }}", "output limit");
}

TEST(ChatTemplateLimitsTest, FormattingStopsAtTheOutputLimit) {
  // 100 fields of 8 MB each: 800 MB against the 8 MiB limit.
  ExpectLimit("{{ ('{0}' * 100).format('x' * 8000000) }}", "output limit");
  ExpectLimit("{{ ('%s' * 100) % (('x' * 8000000,) * 100) }}", "output limit");
  ExpectLimit("{{ ('{0:>100000}' * 200).format(1) }}", "output limit");
}

TEST(ChatTemplateLimitsTest, SplittingOrIteratingMillionsOfItemsIsRefused) {
  ExpectLimit("{{ ('x ' * 4000000).split()|length }}", "items");
  ExpectLimit("{{ ('x,' * 4000000).split(',')|length }}", "items");
  ExpectLimit("{{ ('x\n' * 4000000).splitlines()|length }}", "items");
  ExpectLimit("{% for c in 'x' * 8000000 %}{% endfor %}", "characters");
  ExpectLimit("{{ ('x' * 8000000)|list|length }}", "characters");
}

TEST(ChatTemplateLimitsTest, RepeatedConcatenationHitsTheWorkLimit) {
  // 100000 copies of 4 MB (400 GB of memcpy) within the step budget.
  ExpectLimit(
      "{% set big = 'x' * 4000000 %}{% for i in range(100000) %}{% set t = big ~ 'y' %}"
      "{% endfor %}",
      "work limit");
  ExpectLimit(
      "{% set big = 'x' * 4000000 %}{% for i in range(100000) %}{% if big|length > 0 %}"
      "{% endif %}{% endfor %}",
      "work limit");
}

TEST(ChatTemplateLimitsTest, MembershipAndEqualityOverBigValuesHitTheWorkLimit) {
  // 100000 scans of a million items.
  ExpectLimit(
      "{% set big = [0] * 1000000 %}{% for i in range(100000) %}{% if 1 in big %}{% endif %}"
      "{% endfor %}",
      "work limit");
  // A list holding one 100000-item list 100000 times: 10^10 items to compare or print.
  const std::string nested = "{% set a = [0] * 100000 %}{% set b = [a] * 100000 %}";
  ExpectLimit(nested + "{{ b == b }}", "work limit");
  ExpectLimit(nested + "{{ b }}", "too large to print");
  ExpectLimit(nested + "{{ b|tojson }}", "tojson");
  ExpectLimit(nested + "{{ b|string|length }}", "too large to print");
}

TEST(ChatTemplateLimitsTest, UniqueAndStripAreLinear) {
  // A million items, 100000 distinct: quadratic, that is 10^11 comparisons.
  auto r = RenderChatTemplate("{{ ((range(100000)|list) * 10)|unique|list|length }}",
                              ordered_json::array(), {});
  ASSERT_TRUE(r.ok()) << r.error().what();
  EXPECT_EQ(r.value(), "100000");
  // Stripping a million characters with a set of 200001 distinct ones.
  std::string chars;
  for (char32_t c = 0x10000; c < 0x10000 + 200000; ++c) {
    chars += static_cast<char>(0xf0 | (c >> 18));
    chars += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    chars += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    chars += static_cast<char>(0x80 | (c & 0x3f));
  }
  chars += "a";
  ChatTemplateOptions opts;
  opts.extra_context = {{"chars", chars}};
  r = RenderChatTemplate("[{{ ('a' * 1000000).strip(chars) }}]", ordered_json::array(), opts);
  ASSERT_TRUE(r.ok()) << r.error().what();
  EXPECT_EQ(r.value(), "[]");
}

TEST(ChatTemplateLimitsTest, SearchingIsLinear) {
  // std::string::find is quadratic here: 8 MB of 'a' searched for 4 MB of 'a' then 'b'.
  auto r = RenderChatTemplate(
      "{% set hay = 'a' * 8000000 %}{% set needle = 'a' * 4000000 ~ 'b' %}"
      "{{ needle in hay }} {{ hay.find(needle) }} {{ hay.count(needle) }} "
      "{{ hay.split(needle)|length }} {{ hay.replace(needle, '')|length }}",
      ordered_json::array(), {});
  ASSERT_TRUE(r.ok()) << r.error().what();
  EXPECT_EQ(r.value(), "False -1 0 1 8000000");
}

TEST(ChatTemplateLimitsTest, WorkLimitIsTheConfiguredOne) {
  ChatTemplateOptions opts;
  opts.max_work = 1 << 20;
  // (A variable, so that the repeat is not folded at parse time.)
  opts.extra_context = {{"n", 1000}};
  EXPECT_TRUE(RenderChatTemplate("{{ ('x' * n)|length }}", ordered_json::array(), opts).ok());
  opts.extra_context = {{"n", 2000000}};
  auto r = RenderChatTemplate("{{ ('x' * n)|length }}", ordered_json::array(), opts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.error().what()).find("work limit of 1048576"), std::string::npos)
      << r.error().what();
}

TEST(ChatTemplateLimitsTest, CancelledRenderStops) {
  // Without the callback this runs for 10^10 iterations (the step limit is lifted).
  ChatTemplateOptions opts;
  opts.max_steps = UINT64_MAX;
  int polls = 0;
  opts.cancelled = [&polls] { return ++polls >= 3; };
  auto r = RenderChatTemplate(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
      ordered_json::array(), opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kUnavailable) << r.error().what();
  EXPECT_EQ(polls, 3);
}

TEST(ChatTemplateLimitsTest, RenderStopsWhenAnotherThreadCancelsIt) {
  // The API's case: the client hangs up while its template renders.
  ChatTemplateOptions opts;
  opts.max_steps = UINT64_MAX;
  std::latch started(1);
  std::atomic<bool> gone{false};
  std::atomic<bool> first{true};
  opts.cancelled = [&] {
    if (first.exchange(false)) started.count_down();
    return gone.load();
  };
  Result<std::string> result = std::string();
  std::thread render([&] {
    result = RenderChatTemplate(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        ordered_json::array(), opts);
  });
  started.wait();
  gone = true;
  render.join();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().kind(), ErrorKind::kUnavailable) << result.error().what();
}

}  // namespace
}  // namespace meshnet::jinja
