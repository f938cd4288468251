// SPDX-License-Identifier: Apache-2.0
//
// The one sink of the core's messages. Without a sink installed they go to stderr; the Python
// module installs one that forwards them to logging.getLogger("kvcodec_sdk.native"). write() may
// be called from any thread, with any lock held: a sink must not call back into the core.
#pragma once

#include <functional>
#include <string>

namespace kvcodec::log {

/// Severities, numbered as Python's logging levels.
enum class Level : int
{
    kDebug = 10,
    kInfo = 20,
    kWarning = 30,
    kError = 40,
};

using Sink = std::function<void(Level, std::string const&)>;

/// Installs the sink every later write() calls (an empty one restores stderr). Thread-safe.
void setSink(Sink sink);

/// Delivers one message to the sink (never throws; a throwing sink's message goes to stderr).
void write(Level level, std::string const& message) noexcept;

/// The default sink: "kvcodec: <message>" on stderr.
void writeStderr(Level level, std::string const& message) noexcept;

} // namespace kvcodec::log
