#include "rpc/client_log.h"

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <memory>

namespace meshnet::rpc {

spdlog::logger& ClientLog() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> l = spdlog::get("meshnet.rpc");
    if (!l) {
      try {
        l = spdlog::stderr_color_mt("meshnet.rpc");
        l->set_level(spdlog::level::warn);
      } catch (const spdlog::spdlog_ex&) {  // registered elsewhere meanwhile
        l = spdlog::get("meshnet.rpc");
      }
    }
    spdlog::cfg::load_env_levels();
    return l;
  }();
  return *logger;
}

}  // namespace meshnet::rpc
