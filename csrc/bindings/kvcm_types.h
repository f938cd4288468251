// SPDX-License-Identifier: Apache-2.0
//
// The KV-cache manager binding's named structs: the configuration of kvcm/config.h and the query
// results (kvcm.cpp binds the manager itself). kvcodec_sdk/_boundary.py converts to and from them.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace kvcodec::bindings {

namespace py = pybind11;

// Results of KvcmCore queries that have no C++ struct of their own.
struct SlotCounts
{
    uint64_t numSlots = 0;
    uint64_t freeSlots = 0;
};

struct SlotPeak
{
    uint64_t usedSlots = 0;
    uint64_t peakUsedSlots = 0;
};

struct ColdPool
{
    uintptr_t base = 0;
    uint64_t pageBytes = 0;
    uint64_t numSlots = 0;
    py::object owner; ///< Keeps the pool's memory allocated while a view holds it (None: the core does).
};

struct IndexRingInfo
{
    uint64_t capacity = 0;
    uintptr_t base = 0;
    uint64_t cursor = 0;
    uint64_t liveLeases = 0;
};

struct PageRingInfo
{
    uint64_t capacity = 0;
    int32_t kind = 0; ///< runtime::MemoryKind.
    uint64_t liveLeases = 0;
};

/// Binds the configuration structs (BufferConfig, LayerGroupConfig, DiskTierConfig, KvcmConfig) on `k`.
void bindKvcmConfig(py::module_& k);
/// The manager's test hooks (kvcodec_sdk._native.kvcm_testing; kvcm_testing.cpp).
void bindKvcmTesting(py::module_& t);
/// The remote level's queue, its jobs and RemoteTierConfig (before bindKvcmConfig).
void bindRemoteQueue(py::module_& k);
/// Binds the query results (PageInfo, LifeCycleInfo, MigrationResult, ...) on `k`.
void bindKvcmResults(py::module_& k);
/// handle_ids and make_handles (kvcm_handles.cpp).
void bindKvcmHandles(py::module_& k);

} // namespace kvcodec::bindings
