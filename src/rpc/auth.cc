#include "rpc/auth.h"

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace meshnet::rpc {

std::string BearerValue(std::string_view token) { return "Bearer " + std::string(token); }

std::string ReadPemFile(const std::string& path, const char* what) {
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
