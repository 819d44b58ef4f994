// Heads (src/interp/heads.*): names, lists, ranking, the two random-control schemes and reading an
// [L, H] score from a result file.
#include <doctest/doctest.h>

#include "errors.h"
#include "heads.h"
#include "store.h"
#include "tmpdir.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

using namespace hs;

TEST_CASE("heads: random controls never draw the ablated heads; head lists and top-k") {
    const std::vector<Head> ex = {{1, 0}, {1, 1}, {1, 2}};
    // 5 heads outside the set hold C(5, 3) = 10 distinct sets: asked for 50, all 10 come back.
    int64_t possible = 0;
    const auto sets = random_head_sets(2, 4, ex, 50, 9, &possible);
    CHECK(possible == 10);
    REQUIRE(sets.size() == 10);
    CHECK(std::set<std::vector<Head>>(sets.begin(), sets.end()).size() == 10);
    for (const auto& s : sets) {
        CHECK(s.size() == 3);
        CHECK(std::set<Head>(s.begin(), s.end()).size() == 3);
        for (const auto& h : s) CHECK(std::find(ex.begin(), ex.end(), h) == ex.end());
    }
    CHECK(random_head_sets(2, 4, ex, 50, 9) == sets);
    // A larger pool: as many distinct random sets as asked, reproducible from the seed.
    const auto drawn = random_head_sets(4, 4, ex, 20, 9, &possible);
    CHECK(possible == 21);  // counted up to n_sets + 1: more than enough
    REQUIRE(drawn.size() == 20);
    CHECK(std::set<std::vector<Head>>(drawn.begin(), drawn.end()).size() == 20);
    CHECK(random_head_sets(4, 4, ex, 20, 9) == drawn);
    CHECK(random_head_sets(4, 4, ex, 20, 10) != drawn);
    CHECK_THROWS_AS(random_head_sets(2, 2, ex, 1, 9), UsageError);  // 2 heads left for sets of 3
    CHECK(parse_head_list("L1H0, L0H3", 2, 4) == std::vector<Head>{{1, 0}, {0, 3}});
    CHECK(parse_head_list("L1H0,L1H0", 2, 4) == std::vector<Head>{{1, 0}});
    CHECK_THROWS_AS(parse_head_list("L2H0", 2, 4), UsageError);
    CHECK_THROWS_AS(parse_head_list("1.0", 2, 4), UsageError);
    CHECK_THROWS_AS(parse_head_list(" , ", 2, 4), UsageError);
    auto sc = torch::tensor({0.1, 0.5, 0.2, 0.5, std::nan(""), 0.3}, torch::kDouble).view({2, 3});
    CHECK(top_heads(sc, 3) == std::vector<Head>{{0, 1}, {1, 0}, {1, 2}});
    CHECK(rank_heads(sc, false) == std::vector<int64_t>{0, 2, 5, 1, 3, 4});  // ascending, NaN still last
    CHECK(format_heads({{0, 1}, {12, 3}}) == "L0H1,L12H3");
    int l = -1, h = -1;
    CHECK(parse_head_name("L12H3", l, h));
    CHECK((l == 12 && h == 3));
    for (const char* bad : {"L1", "H1", "L1H", "LH1", "L1H2x", "l1h2", "L1234567H0"}) {
        CAPTURE(bad);
        CHECK(!parse_head_name(bad, l, h));
    }
}

TEST_CASE("heads: the study scheme draws one shuffled subset per seed") {
    const std::vector<int64_t> pool = {0, 2, 3, 5, 7};
    const auto a = random_subset(pool, 3, 17);
    CHECK(a.size() == 3);
    CHECK(a == random_subset(pool, 3, 17));
    for (auto x : a) CHECK(std::find(pool.begin(), pool.end(), x) != pool.end());
    // The subset is the first k of std::shuffle with that engine (how recorded sets were drawn).
    auto p = pool;
    std::mt19937_64 rng(17);
    std::shuffle(p.begin(), p.end(), rng);
    CHECK(a == std::vector<int64_t>(p.begin(), p.begin() + 3));
}

TEST_CASE("heads: a score [L, H] read from a result file, with errors that name the value") {
    TempDir tmp;
    const std::string f = tmp.file("s.h5");
    {
        ResultWriter w(f, WriteMode::kCreate);
        w.write("/scores/x/score", std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
        w.write("/scores/y/score", std::vector<float>{1, 2}, {2});
        w.commit();
    }
    const auto ref = split_head_score_ref(f + ":scores/x/score");
    CHECK(ref.file == f);
    CHECK(ref.dataset == "/scores/x/score");
    auto s = read_head_score(ref, 2, 3);
    CHECK(s[1][2].item<double>() == 6.0);
    CHECK_THROWS_WITH_AS(read_head_score(split_head_score_ref(f + ":/scores/y/score"), 2, 3),
                         doctest::Contains("is [2], expected [2, 3] (this model's layers x heads)"), UsageError);
    CHECK_THROWS_WITH_AS(read_head_score(split_head_score_ref(f + ":/scores/z"), 2, 3), doctest::Contains("has no dataset /scores/z"),
                         UsageError);
    CHECK_THROWS_AS(read_head_score(split_head_score_ref(f + ":/scores/x"), 2, 3), UsageError);  // a group
    CHECK_THROWS_AS(split_head_score_ref("nocolon"), UsageError);
    CHECK_THROWS_AS(split_head_score_ref("file.h5:"), UsageError);
    CHECK(split_head_score_ref("a:b.h5:/d").file == "a:b.h5");
}
