// Token-id files (--tokens-file of detect and friends): one sequence a line of comma-separated
// ids, read as the commands read it (src/base/util.cpp split, trim, parse_token_list), then the range
// check against a vocabulary. Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "errors.h"
#include "util.h"

#include <fmt/format.h>

HS_FUZZ_TARGET(tokens) {
    const std::string path = hs_fuzz::write_temp("tokens.txt", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("tokens", {hs::ExitCode::kData}, [&] {
        const std::string text = hs::read_text_file(path);
        hs_fuzz::check(text.size() == size, "tokens", "read_text_file lost bytes");
        int line_no = 0;
        for (const auto& raw : hs::split(text, '\n')) {
            ++line_no;
            const auto line = hs::trim(raw);
            if (line.empty()) continue;
            const std::string where = fmt::format("{}:{}", path, line_no);
            auto ids = hs::parse_token_list(line, where);
            hs_fuzz::check(!ids.empty(), "tokens", "parse_token_list returned no ids without an error");
            for (auto id : ids)
                if (id < 0 || id >= 512)
                    throw hs::DataError(fmt::format("{}: token id {} out of range [0, 512)", where, id));
        }
    });
}
