// Named tensors across one or more safetensors files, with the checks every family needs:
// presence, float dtype, exact shape, and conversion to the compute dtype/device.
#pragma once

#include "model.h"
#include "safetensors.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hs {

class WeightSource {
public:
    // files: single model.safetensors, or the shards named by model.safetensors.index.json.
    explicit WeightSource(std::vector<std::string> files, LoadOptions opts);
    // Tensors already read and renamed (a GGUF file's, under Hugging Face names); `file` names
    // them in messages.
    WeightSource(std::string file, std::map<std::string, at::Tensor> tensors, LoadOptions opts);

    bool has(const std::string& name) const;
    // Tensor `name` with exactly `shape`, converted to the compute dtype and device. Throws
    // ModelLoadError naming the file: missing, non-float dtype, wrong shape.
    at::Tensor take(const std::string& name, const std::vector<int64_t>& shape) const;
    // The same, or an undefined tensor when absent.
    at::Tensor take_optional(const std::string& name, const std::vector<int64_t>& shape) const;
    // Raw stored tensor (stored dtype, CPU), for layouts a family must rearrange first.
    at::Tensor raw(const std::string& name) const;
    at::Tensor convert(const at::Tensor& t) const;  // to compute dtype and device, contiguous
    std::string describe() const;                   // first file name (+ N shards)
    const std::vector<std::string>& files() const { return files_; }
    // Elements of every tensor in every file (and of the largest one, when asked).
    double stored_values(double* largest = nullptr) const;

private:
    const SafetensorsFile* find(const std::string& name) const;
    std::vector<std::string> files_;
    std::vector<std::unique_ptr<SafetensorsFile>> st_;
    std::map<std::string, at::Tensor> mem_;  // the in-memory form (files_ holds its one file name)
    LoadOptions opts_;
};

}  // namespace hs
