// SPDX-License-Identifier: Apache-2.0
//
// The core's messages (runtime/log.h) to a Python handler. Any thread may write, holding any lock
// of the core, with or without the GIL: the sink only queues the message and asks the interpreter
// (Py_AddPendingCall, callable without the GIL) to run the delivery on the main thread with the GIL
// held. flush_log() delivers what is queued at once from the calling thread.
#include <pybind11/pybind11.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/log.h"

namespace py = pybind11;
using namespace kvcodec;

namespace {

constexpr size_t kMaxQueued = 4096; // beyond this, messages are counted and reported as discarded

struct LogQueue
{
    std::mutex mu;
    std::deque<std::pair<log::Level, std::string>> messages;
    size_t discarded = 0;
    bool scheduled = false; // a pending call is queued and has not yet taken the messages
};

LogQueue& queue()
{
    static auto* q = new LogQueue(); // never destroyed: native threads may write during exit
    return *q;
}

// The Python handler, (level, message) -> None; accessed with the GIL held only. Never destroyed
// at exit (its destructor would need the GIL).
py::object*& handler()
{
    static py::object* h = nullptr;
    return h;
}

std::pair<std::deque<std::pair<log::Level, std::string>>, size_t> takeQueued()
{
    LogQueue& q = queue();
    std::lock_guard<std::mutex> lock(q.mu);
    q.scheduled = false;
    std::pair<std::deque<std::pair<log::Level, std::string>>, size_t> out{std::move(q.messages), q.discarded};
    q.messages.clear();
    q.discarded = 0;
    return out;
}

// With the GIL held: hands every queued message to the handler (stderr without one). Returns
// how many were delivered. A raising handler is reported as unraisable, never propagated.
size_t deliverQueued()
{
    auto [messages, discarded] = takeQueued();
    if (discarded != 0)
    {
        messages.emplace_back(log::Level::kWarning,
            std::to_string(discarded) + " native log messages were discarded (more than " + std::to_string(kMaxQueued)
                + " queued before Python could take them)");
    }
    for (auto& [level, text] : messages)
    {
        if (handler() == nullptr)
        {
            log::writeStderr(level, text);
            continue;
        }
        try
        {
            (*handler())(int(level), text);
        }
        catch (py::error_already_set& e)
        {
            e.discard_as_unraisable("kvcodec_sdk native log handler");
        }
    }
    return messages.size();
}

int pendingDelivery(void*)
{
    deliverQueued();
    return 0;
}

void queueMessage(log::Level level, std::string const& text)
{
    LogQueue& q = queue();
    bool schedule = false;
    {
        std::lock_guard<std::mutex> lock(q.mu);
        if (q.messages.size() >= kMaxQueued)
        {
            ++q.discarded;
        }
        else
        {
            q.messages.emplace_back(level, text);
        }
        if (!q.scheduled)
        {
            q.scheduled = schedule = true;
        }
    }
    if (schedule && (!Py_IsInitialized() || Py_AddPendingCall(&pendingDelivery, nullptr) != 0))
    {
        // The interpreter's pending-call queue is full (or Python is gone): the next message or a
        // flush_log() delivers these.
        std::lock_guard<std::mutex> lock(q.mu);
        q.scheduled = false;
    }
}

} // namespace

void bindLog(py::module_& m)
{
    m.def(
        "set_log_handler",
        [](py::object fn) {
            if (!fn.is_none() && !PyCallable_Check(fn.ptr()))
            {
                throw py::type_error("the native log handler must be callable(level, message) or None");
            }
            deliverQueued(); // what was queued goes to the handler it was written under
            delete handler();
            handler() = nullptr;
            if (fn.is_none())
            {
                log::setSink(nullptr);
                return;
            }
            handler() = new py::object(std::move(fn));
            log::setSink(&queueMessage);
        },
        py::arg("handler").none(true),
        "Routes the core's messages to handler(level, message) (Python logging levels), delivered on "
        "the main thread; None restores stderr.");
    m.def("flush_log", &deliverQueued, "Delivers the queued native log messages now; returns how many.");

    py::module_ t = m.attr("kvcm_testing").cast<py::module_>();
    t.def(
        "log_from_threads",
        [](int level, std::string const& message, int threads, int perThread) {
            py::gil_scoped_release release;
            std::vector<std::thread> workers;
            for (int i = 0; i < threads; ++i)
            {
                workers.emplace_back([=] {
                    for (int j = 0; j < perThread; ++j)
                    {
                        log::write(log::Level(level), message + " " + std::to_string(i) + "." + std::to_string(j));
                    }
                });
            }
            for (auto& w : workers)
            {
                w.join();
            }
        },
        py::arg("level"), py::arg("message"), py::arg("threads") = 1, py::arg("per_thread") = 1,
        "Writes native log messages from new native threads (no Python thread state), then joins them.");
}
