// What several subcommands share: the default model and flag parsers.
#pragma once

#include <string>

#include "util/dtype.h"

namespace meshnet::cli {

// The shipped model when --model is not given: models/stories260K.gguf under
// the current directory; else, from the directory of the running executable
// upwards, the first models/stories260K.gguf or
// share/meshnet/models/stories260K.gguf (a build tree finds the source tree's
// copy, an installed bin/meshnet finds <prefix>/share/meshnet/models); else
// the relative path, which then fails to open with a message naming it.
std::string DefaultModelPath();

// --kv-dtype: float32, float16, bfloat16 or the aliases f32/fp32, f16/fp16,
// bf16. Throws kInvalidArgument naming the choices.
KvDtype ParseKvDtypeFlag(const std::string& s);

// --auth-token, or $MESHNET_AUTH_TOKEN when the flag is not given.
std::string AuthTokenOrEnv(const std::string& flag);
// --admin-token, else $MESHNET_ADMIN_TOKEN, else "".
std::string AdminTokenOrEnv(const std::string& flag);

}  // namespace meshnet::cli
