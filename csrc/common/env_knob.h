// Measurement knobs read from the environment (host only, no torch): A/B switches of the
// benchmarks, read once per process by each caller (function-local statics).
#pragma once

#include <cstdlib>
#include <cstring>

namespace deepinfer_sm80 {

// $name set to exactly `value`.
inline bool knob_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, value) == 0;
}

// $name set to "0": the feature it names is off.
inline bool knob_off(const char* name) { return knob_is(name, "0"); }

// $name as an integer (std::atoi), or `fallback` when unset.
inline int knob_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e != nullptr ? std::atoi(e) : fallback;
}

}  // namespace deepinfer_sm80
