// The client side's logger, "meshnet.rpc": stderr (stdout carries generated
// text), warnings and up unless SPDLOG_LEVEL says otherwise (e.g.
// SPDLOG_LEVEL=meshnet.rpc=debug shows every node's route cost).
#pragma once

#include <spdlog/spdlog.h>

namespace meshnet::rpc {

spdlog::logger& ClientLog();

}  // namespace meshnet::rpc
