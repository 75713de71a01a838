#include "rpc/auth.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "util/error.h"

namespace meshnet::rpc {

std::string BearerValue(std::string_view token) { return "Bearer " + std::string(token); }

std::string ReadPemFile(const std::string& path, const char* what) {
  // Not a regular file (a FIFO would block the open, a directory reads as
  // nothing): refused before opening.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    ThrowInvalidArgument(std::string("cannot read ") + what + " file '" + path +
                         "': not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) ThrowInvalidArgument(std::string("cannot read ") + what + " file '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.find("-----BEGIN") == std::string::npos) {
    ThrowInvalidArgument(std::string(what) + " file '" + path + "' is not PEM");
  }
  return text;
}

}  // namespace meshnet::rpc
