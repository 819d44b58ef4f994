#include "intervention.h"

#include "errors.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>

namespace hs {

const NameTable<Intervention>& intervention_names() {
    static const NameTable<Intervention> t = {
        {Intervention::kZero, "zero"},
        {Intervention::kMean, "mean"},
        {Intervention::kResample, "resample"},
        {Intervention::kScale, "scale"},
        {Intervention::kZeroQuery, "zero-query"},
        {Intervention::kMeanQuery, "mean-query"},
        {Intervention::kMeanQueryPreRope, "mean-query-pre-rope"},
        {Intervention::kStream, "stream"},
    };
    return t;
}

const char* intervention_name(Intervention i) {
    return i == Intervention::kNone ? "none" : name_in(intervention_names(), i);
}

std::vector<std::string> intervention_name_list(const std::vector<Intervention>& allowed) {
    if (allowed.empty()) return names_in(intervention_names());
    std::vector<std::string> out;
    for (auto a : allowed) out.emplace_back(intervention_name(a));
    return out;
}

static bool is_allowed(Intervention i, const std::vector<Intervention>& allowed) {
    return allowed.empty() || std::find(allowed.begin(), allowed.end(), i) != allowed.end();
}

Intervention parse_intervention(const std::string& s, const std::string& what, const std::vector<Intervention>& allowed) {
    const auto found = find_in(intervention_names(), s);
    if (!found || !is_allowed(*found, allowed))
        throw UsageError(what + " '" + s + "': expected " + or_list(intervention_name_list(allowed)));
    return *found;
}

const std::vector<Intervention>& study_interventions() {
    static const std::vector<Intervention> v = {Intervention::kZero,      Intervention::kMean,      Intervention::kResample,
                                                Intervention::kScale,     Intervention::kZeroQuery, Intervention::kMeanQuery,
                                                Intervention::kStream};
    return v;
}

const NameTable<Intervention>& study_intervention_names() {
    static const NameTable<Intervention> t = subset_of(intervention_names(), study_interventions());
    return t;
}

Point intervention_point(Intervention i) {
    switch (i) {
        case Intervention::kZero:
        case Intervention::kMean:
        case Intervention::kResample:
        case Intervention::kScale: return Point::kAttnZ;
        case Intervention::kZeroQuery:
        case Intervention::kMeanQuery: return Point::kAttnQ;
        case Intervention::kMeanQueryPreRope: return Point::kAttnQPreRope;
        case Intervention::kStream:
        case Intervention::kNone: break;
    }
    return Point::kCount;
}

bool needs_reference(Intervention i) {
    return i == Intervention::kMean || i == Intervention::kMeanQuery || i == Intervention::kResample;
}

static void require_allowed(const InterventionSpec& spec, const std::vector<Intervention>& allowed) {
    HS_REQUIRE(is_allowed(spec.mode, allowed),
               std::string("apply_intervention: this caller does not run ") + intervention_name(spec.mode));
}

void apply_intervention(Hooks& hooks, const InterventionSpec& spec, const std::vector<Head>& heads, int64_t row,
                        const std::vector<Intervention>& allowed) {
    if (spec.mode == Intervention::kNone) return;
    require_allowed(spec, allowed);
    HS_REQUIRE(spec.mode != Intervention::kResample, "apply_intervention: resample needs per-row sources (the per-row form)");
    for (auto [l, h] : heads) {
        switch (spec.mode) {
            case Intervention::kZero: hooks.intervene_z(HeadIntervention{l, h, row, HeadOp::kZero, 0.0, {}}); break;
            case Intervention::kScale: hooks.intervene_z(HeadIntervention{l, h, row, HeadOp::kScale, spec.factor, {}}); break;
            case Intervention::kMean:
                hooks.intervene_z(HeadIntervention{l, h, row, HeadOp::kReplace, 0.0, spec.value[l][h]});
                break;
            case Intervention::kZeroQuery: hooks.intervene_q(HeadIntervention{l, h, row, HeadOp::kZero, 0.0, {}}); break;
            case Intervention::kMeanQuery:
                hooks.intervene_q(HeadIntervention{l, h, row, HeadOp::kReplace, 0.0, spec.value[l][h]});
                break;
            case Intervention::kMeanQueryPreRope:
                hooks.intervene_q_pre_rope(HeadIntervention{l, h, row, HeadOp::kReplace, 0.0, spec.value[l][h]});
                break;
            case Intervention::kStream: hooks.window(HeadWindow{l, h, row, spec.window, {}}); break;
            case Intervention::kResample:
            case Intervention::kNone: break;
        }
    }
}

void apply_intervention(Hooks& hooks, const InterventionSpec& spec, const LayerRows& rows,
                        const std::vector<Intervention>& allowed) {
    if (spec.mode == Intervention::kNone) return;
    require_allowed(spec, allowed);
    if (spec.mode == Intervention::kStream) {  // a window on every (row, head) the mask names, not an edit
        hooks.window(HeadWindow{rows.layer, 0, -1, spec.window, rows.mask});
        return;
    }
    const int64_t R = rows.mask.size(0), H = rows.mask.size(1);
    const auto drop = rows.mask.view({R, 1, H, 1});
    at::Tensor factor;  // scale: [R, 1, 1, 1]
    if (spec.mode == Intervention::kScale)
        factor = (rows.row_factors.defined() ? rows.row_factors.to(rows.mask.device(), torch::kDouble)
                                             : torch::full({R}, spec.factor, rows.mask.options().dtype(torch::kDouble)))
                     .view({R, 1, 1, 1});
    const Intervention mode = spec.mode;
    const at::Tensor value = spec.value;
    const bool per_pos = rows.per_position;
    hooks.edit(intervention_point(mode), [drop, value, mode, factor, per_pos](int, const at::Tensor& x) -> std::optional<at::Tensor> {
        auto d = drop.to(x.scalar_type());
        switch (mode) {
            case Intervention::kZero:
            case Intervention::kZeroQuery: return x * (1 - d);
            case Intervention::kScale: return x * (1 + d * (factor.to(x.scalar_type()) - 1));
            case Intervention::kMean:
            case Intervention::kMeanQuery:
            case Intervention::kMeanQueryPreRope: {
                const int64_t T = x.size(1);
                auto v = per_pos ? value.narrow(0, 0, T).unsqueeze(0) : value.view({1, 1, value.size(0), value.size(1)});
                return x + d * (v - x);
            }
            case Intervention::kResample: return x + d * (value.narrow(1, 0, x.size(1)) - x);
            case Intervention::kStream:
            case Intervention::kNone: break;
        }
        return std::nullopt;
    }, rows.layer);
}

}  // namespace hs
