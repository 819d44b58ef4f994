// Precompiled header for every target: <torch/torch.h> costs ~30 s per translation unit here.
#pragma once
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
