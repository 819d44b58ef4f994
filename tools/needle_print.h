// `retrieval`'s printed summary (tools/needle_print.cpp): what the needle study returned, as the
// command prints it. The library returns results; the tools print them.
#pragma once

#include "needle_study.h"

#include <string>
#include <vector>

namespace hs {

// The protocol's resolved choices in one line; the
// accuracy, each score's top heads (registry order), the ablation and decoding sets; the stream
// sweep's curve.
std::string needle_protocol_line(const NeedleProtocol& pr, const std::vector<int64_t>& stop_ids);
void print_needle_summary(const NeedleStudySpec& spec, const NeedleStudy& study, const NeedleSummary& sum, int L, int H);
void print_stream_sweep(const NeedleStudySpec& spec, const StreamSweep& sw, const std::string& source, const NeedleSummary& sum);

}  // namespace hs
