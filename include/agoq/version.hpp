/// \file
/// Library version.
#pragma once

namespace agoq {

/// Major version: incremented on incompatible changes of the API or of the format contract.
inline constexpr int version_major = 0;
/// Minor version: incremented on compatible additions.
inline constexpr int version_minor = 1;
/// Patch version.
inline constexpr int version_patch = 0;
/// Version of the byte layout documented in docs/formats.md; a payload records it.
inline constexpr int format_version = 1;

}  // namespace agoq
