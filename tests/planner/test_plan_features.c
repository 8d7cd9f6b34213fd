// ctest-labels: unit
/* Planner features after ExecuTorch, MindSpore and inductor: arenas with their own capacities,
 * unplanned (runtime-supplied) buffers, in-place aliases (planned at the same offset, counted once
 * in the bound, the only overlap the verifier accepts), exact-key reuse, the double cursor; each
 * through the C API and the CSV reader, bad input included. */
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc_plan.h"

static vmm_plan_buffer buf(int64_t lo, int64_t hi, uint64_t size)
{
    vmm_plan_buffer b = {lo, hi, size, 0, -1, 0, 0, 0, 0, 0};
    return b;
}

static vmm_plan_buffer alias_of(vmm_plan_buffer b, size_t target)
{
    b.flags |= VMM_PLAN_ALIAS;
    b.alias = target;
    return b;
}

static int plan(vmm_plan_buffer *b, size_t n, int algo, vmm_plan_result *r)
{
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.algo = algo;
    o.time_limit_s = 5;
    memset(r, 0, sizeof *r);
    int rc = vmm_plan(b, n, &o, r);
    if (rc == VMM_OK) {
        uint64_t arena = 0;
        CHECK_OK(vmm_plan_verify(b, n, &arena));
        CHECK_EQ(arena, r->arena_bytes);
    }
    return rc;
}

static void expect_check(vmm_plan_buffer *b, size_t n, size_t want_bad, const char *needle)
{
    size_t bad = SIZE_MAX;
    CHECK_EQ(vmm_plan_check(b, n, &bad), VMM_EINVAL);
    CHECK_EQ(bad, want_bad);
    if (!strstr(vmm_last_error(), needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", vmm_last_error(), needle);
        vmm_test_failures++;
    }
    vmm_plan_result r;
    uint64_t off0 = b[0].offset;
    CHECK_EQ(vmm_plan(b, n, NULL, &r), VMM_EINVAL);
    CHECK_EQ(b[0].offset, off0); /* untouched */
}

static void in_place(void)
{
    /* a [0,5) is read for the last time by the op at step 4, which writes b over it; b the same
     * way for d. c lives throughout. Without the aliases the bound is 64 + 64 + 32 at step 4. */
    vmm_plan_buffer b[4] = {buf(0, 5, 64), alias_of(buf(4, 9, 64), 0), buf(0, 12, 32), alias_of(buf(8, 12, 64), 1)};
    uint64_t lb = 0;
    CHECK_OK(vmm_plan_lower_bound(b, 4, &lb));
    CHECK_EQ(lb, 96);
    vmm_plan_result r;
    for (int a = 0; a < VMM_PLAN_ALGO_COUNT; a++) {
        CHECK_OK(plan(b, 4, a, &r));
        CHECK_EQ(b[1].offset, b[0].offset);
        CHECK_EQ(b[3].offset, b[0].offset);
        CHECK_EQ(r.lower_bound_bytes, 96);
        CHECK_EQ(r.arena_bytes, 96); /* two blocks, any order */
    }
    /* Unequal sizes: the chain is planned as one block of 100 B over [0, 9), so c (60 B) goes
     * above it; the bound counts each buffer at its own size and the shared step 4 once: 100 at
     * steps 0-4, 40 + 60 at 5-8. */
    vmm_plan_buffer u[3] = {buf(0, 5, 100), alias_of(buf(4, 9, 40), 0), buf(5, 9, 60)};
    CHECK_OK(vmm_plan_lower_bound(u, 3, &lb));
    CHECK_EQ(lb, 100);
    CHECK_OK(plan(u, 3, VMM_PLAN_BEST, &r));
    CHECK_EQ(u[1].offset, u[0].offset);
    CHECK_EQ(r.lower_bound_bytes, 100);
    CHECK_EQ(r.arena_bytes, 160);
    CHECK_EQ(r.optimal, 0); /* 160 is optimal for the block, not proven for the buffers (100 is) */
}

static void verifier(void)
{
    /* The alias overlap at the same offset is accepted ... */
    vmm_plan_buffer b[3] = {alias_of(buf(4, 9, 16), 1), buf(0, 5, 8), buf(0, 9, 8)};
    b[0].offset = 0, b[1].offset = 0, b[2].offset = 16;
    uint64_t arena = 0;
    CHECK_OK(vmm_plan_verify(b, 3, &arena));
    CHECK_EQ(arena, 24);
    /* ... not at another offset ... */
    b[0].offset = 4;
    CHECK_EQ(vmm_plan_verify(b, 3, &arena), VMM_ECORRUPT);
    /* ... and the alias (16 B, sorted before its target) still may not reach the buffer above its
     * 8 B target: the check looks past the chain's cluster. */
    b[0].offset = 0, b[2].offset = 8;
    CHECK_EQ(vmm_plan_verify(b, 3, &arena), VMM_ECORRUPT);
    /* Two buffers of no chain at one offset overlap, an alias flag or not elsewhere. */
    b[0] = buf(4, 9, 16);
    b[0].offset = 0, b[2].offset = 16;
    CHECK_EQ(vmm_plan_verify(b, 3, &arena), VMM_ECORRUPT);
    /* Arenas do not conflict; unplanned buffers take no bytes. */
    vmm_plan_buffer a[3] = {buf(0, 9, 8), buf(0, 9, 8), buf(0, 9, 64)};
    a[1].arena = 3;
    a[2].flags = VMM_PLAN_UNPLANNED;
    CHECK_OK(vmm_plan_verify(a, 3, &arena));
    CHECK_EQ(arena, 16); /* 8 in arena 0 plus 8 in arena 3 */
}

static void arenas_and_unplanned(void)
{
    /* Arena 0: two 100 B buffers live together; arena 2: one 50 B; an unplanned 1000 B input and
     * the output aliasing it (fed back: the runtime's one buffer). */
    vmm_plan_buffer b[5] = {buf(0, 4, 100), buf(2, 6, 100), buf(0, 6, 50), buf(0, 3, 1000),
                            alias_of(buf(2, 6, 1000), 3)};
    b[2].arena = 2;
    b[3].flags |= VMM_PLAN_UNPLANNED;
    vmm_plan_result r;
    CHECK_OK(plan(b, 5, VMM_PLAN_BEST, &r));
    CHECK_EQ(r.arena_count, 2);
    CHECK_EQ(r.unplanned, 2);
    CHECK_EQ(r.arenas[0].id, 0);
    CHECK_EQ(r.arenas[0].bytes, 200);
    CHECK_EQ(r.arenas[0].buffers, 2);
    CHECK_EQ(r.arenas[1].id, 2);
    CHECK_EQ(r.arenas[1].bytes, 50);
    CHECK_EQ(r.arenas[1].lower_bound_bytes, 50);
    CHECK_EQ(b[2].offset, 0); /* its own arena starts at 0 */
    CHECK_EQ(r.arena_bytes, 250);
    CHECK_EQ(r.lower_bound_bytes, 250);
    uint64_t lb = 0;
    CHECK_OK(vmm_plan_lower_bound_arena(b, 5, 2, &lb));
    CHECK_EQ(lb, 50);
    CHECK_OK(vmm_plan_lower_bound_arena(b, 5, 7, &lb));
    CHECK_EQ(lb, 0);
    CHECK_EQ(vmm_plan_lower_bound_arena(b, 5, VMM_PLAN_MAX_ARENAS, &lb), VMM_EINVAL);
    /* Capacities per arena: arena 2 fits 50, arena 0 cannot fit 150 (both live at 2..4). */
    uint64_t caps[VMM_PLAN_MAX_ARENAS] = {0};
    caps[2] = 50;
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.capacities = caps;
    o.capacity = 150; /* for arena 0, which has no entry */
    CHECK_EQ(vmm_plan(b, 5, &o, &r), VMM_ENOMEM);
    CHECK(strstr(vmm_last_error(), "arena 0") != NULL);
    CHECK_EQ(r.arenas[0].capacity, 150);
    CHECK_EQ(r.arenas[1].capacity, 50);
    o.capacity = 200;
    CHECK_OK(vmm_plan(b, 5, &o, &r));
    caps[5] = 10; /* no buffer in arena 5 */
    CHECK_EQ(vmm_plan(b, 5, &o, &r), VMM_EINVAL);
}

static void reuse(void)
{
    /* inductor's rule: a freed buffer is reused by one of the same size, alignment and key only. */
    vmm_plan_buffer b[4] = {buf(0, 2, 64), buf(2, 4, 64), buf(4, 6, 64), buf(6, 8, 32)};
    vmm_plan_result r;
    CHECK_OK(plan(b, 4, VMM_PLAN_REUSE, &r));
    CHECK_EQ(b[1].offset, b[0].offset);
    CHECK_EQ(b[2].offset, b[0].offset);
    CHECK_EQ(r.arena_bytes, 96); /* the 32 B one gets new bytes: no splitting */
    b[2].key = 7;                /* say another dtype */
    CHECK_OK(plan(b, 4, VMM_PLAN_REUSE, &r));
    CHECK_EQ(b[1].offset, b[0].offset);
    CHECK(b[2].offset != b[0].offset);
    CHECK_EQ(r.arena_bytes, 160);
    CHECK_OK(plan(b, 4, VMM_PLAN_BEST, &r)); /* best does not care about keys */
    CHECK_EQ(r.arena_bytes, 64);
}

static void double_cursor(void)
{
    /* Weights live throughout; activations come and go. */
    enum { N = 40 };
    vmm_plan_buffer b[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int64_t lo = (int64_t)(x >> 33) % 90;
        int64_t len = i % 4 == 0 ? 60 + (int64_t)(x >> 20) % 40 : 1 + (int64_t)(x >> 24) % 12;
        b[i] = buf(lo, lo + len, 16 * (1 + (x >> 40) % 32));
    }
    vmm_plan_result best, cur;
    CHECK_OK(plan(b, N, VMM_PLAN_BEST, &best));
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.double_cursor = 1;
    o.time_limit_s = 5;
    CHECK_OK(vmm_plan(b, N, &o, &cur));
    uint64_t arena = 0;
    CHECK_OK(vmm_plan_verify(b, N, &arena));
    CHECK(cur.arena_bytes >= best.arena_bytes); /* a constraint: never below the free plan */
    CHECK(cur.arenas[0].long_lived_bytes > 0);
    /* long-lived = lifetime >= half the span [min lower, max upper) */
    int64_t t0 = b[0].lower, t1 = b[0].upper;
    for (int i = 0; i < N; i++) {
        t0 = b[i].lower < t0 ? b[i].lower : t0;
        t1 = b[i].upper > t1 ? b[i].upper : t1;
    }
    int nlong = 0;
    for (int i = 0; i < N; i++) {
        int is_long = 2 * (b[i].upper - b[i].lower) >= t1 - t0;
        nlong += is_long;
        if (is_long)
            CHECK(b[i].offset + b[i].size <= cur.arenas[0].long_lived_bytes);
        else
            CHECK(b[i].offset >= cur.arenas[0].long_lived_bytes);
    }
    CHECK(nlong > 0 && nlong < N);
    printf("double cursor: %llu B against best's %llu B (%d long-lived of %d)\n",
           (unsigned long long)cur.arena_bytes, (unsigned long long)best.arena_bytes, nlong, N);
    o.long_lived = 1.5;
    CHECK_EQ(vmm_plan(b, N, &o, &cur), VMM_EINVAL);
}

static void bad_input(void)
{
    vmm_plan_buffer b[3] = {buf(0, 5, 8), buf(4, 9, 8), buf(4, 9, 8)};
    b[0].offset = 99;
    b[1].arena = VMM_PLAN_MAX_ARENAS;
    expect_check(b, 3, 1, "unknown arena");
    b[1].arena = 0;
    b[1].flags = 0x80;
    expect_check(b, 3, 1, "unknown flags");
    b[1] = alias_of(buf(3, 9, 8), 0); /* a dies at 5, not at 3 + 1 */
    expect_check(b, 3, 1, "may only alias");
    b[1] = alias_of(buf(4, 9, 8), 1);
    expect_check(b, 3, 1, "aliases itself");
    b[1] = alias_of(buf(4, 9, 8), 3);
    expect_check(b, 3, 1, "not a buffer index");
    b[1] = alias_of(buf(4, 9, 8), 0);
    b[2] = alias_of(buf(4, 9, 8), 0);
    expect_check(b, 3, 2, "already aliased");
    b[2] = buf(4, 9, 8);
    b[1].group = 4;
    expect_check(b, 3, 1, "group member cannot be an alias");
    b[1].group = -1;
    b[0].group = 4;
    expect_check(b, 3, 1, "is a group member");
    b[0].group = -1;
    b[1].arena = 1;
    expect_check(b, 3, 1, "another arena");
    b[1].arena = 0;
    b[1].flags |= VMM_PLAN_UNPLANNED;
    expect_check(b, 3, 1, "which is planned");
    b[1] = buf(4, 9, 8);
    b[2].flags = VMM_PLAN_UNPLANNED;
    b[2].group = 1;
    expect_check(b, 3, 2, "cannot be unplanned");
}

static void csv_expect(const char *text, const char *needle)
{
    vmm_plan_problem p;
    int rc = vmm_plan_parse_csv(text, strlen(text), "f.csv", &p);
    CHECK_EQ(rc, VMM_EINVAL);
    if (rc == VMM_EINVAL && !strstr(vmm_last_error(), needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", vmm_last_error(), needle);
        vmm_test_failures++;
    }
    CHECK(p.count == 0 && p.buffers == NULL);
}

static void csv(void)
{
    const char *text = "id,lower,upper,size,arena,unplanned,alias,key\n"
                       "in,0,3,100,0,1,,\n"
                       "w,0,10,50,1,0,,\n"
                       "a,0,3,64,0,0,,\n"
                       "b,2,6,64,0,,a,5\n"
                       "c,1,5,32,,0,,\n";
    vmm_plan_problem p;
    CHECK_OK(vmm_plan_parse_csv(text, strlen(text), "f.csv", &p));
    CHECK_EQ(p.count, 5);
    CHECK(p.has_arena && p.has_unplanned && p.has_alias && p.has_key);
    CHECK_EQ(p.buffers[0].flags, VMM_PLAN_UNPLANNED);
    CHECK_EQ(p.buffers[1].arena, 1);
    CHECK_EQ(p.buffers[3].flags, VMM_PLAN_ALIAS);
    CHECK_EQ(p.buffers[3].alias, 2);
    CHECK_EQ(p.buffers[3].key, 5);
    vmm_plan_result r;
    CHECK_OK(plan(p.buffers, p.count, VMM_PLAN_BEST, &r));
    CHECK_EQ(p.buffers[3].offset, p.buffers[2].offset);
    CHECK_EQ(r.arena_count, 2);
    CHECK_EQ(r.arenas[0].bytes, 96);
    CHECK_OK(vmm_plan_save_csv(&p, "test_plan_features.out.csv"));
    vmm_plan_problem q;
    CHECK_OK(vmm_plan_load_csv("test_plan_features.out.csv", &q));
    CHECK_EQ(q.count, 5);
    CHECK_EQ(q.buffers[3].alias, 2);
    CHECK_EQ(q.buffers[1].arena, 1);
    CHECK_OK(vmm_plan_save_svg(&p, "test_plan_features.out.svg"));
    FILE *f = fopen("test_plan_features.out.svg", "r");
    char svg[1 << 14];
    size_t got = f ? fread(svg, 1, sizeof svg - 1, f) : 0;
    svg[got] = '\0';
    if (f)
        fclose(f);
    CHECK(strstr(svg, "arena 1: 50 bytes") != NULL);
    CHECK(strstr(svg, "stroke-dasharray") != NULL);
    CHECK(strstr(svg, "1 unplanned") != NULL);
    vmm_plan_problem_free(&q);
    vmm_plan_problem_free(&p);
    remove("test_plan_features.out.csv");
    remove("test_plan_features.out.svg");

    const char *h = "id,lower,upper,size,arena,unplanned,alias,group\n";
    char t[512];
#define BAD(rows, needle)                              \
    do {                                               \
        snprintf(t, sizeof t, "%s%s", h, rows);        \
        csv_expect(t, needle);                         \
    } while (0)
    BAD("a,0,3,8,16,0,,\n", "f.csv:2: unknown arena '16'");
    BAD("a,0,3,8,x,0,,\n", "f.csv:2: unknown arena 'x'");
    BAD("a,0,3,8,0,2,,\n", "f.csv:2: bad unplanned");
    BAD("a,0,3,8,0,0,,\nb,1,5,8,0,0,zz,\n", "f.csv:3: alias 'zz' names no buffer");
    BAD("a,0,3,8,0,0,,\nb,1,5,8,0,0,a,\n", "f.csv:3: buffer 'b', born at 1, may only alias");
    BAD("a,0,3,8,0,0,,\nb,2,5,8,1,0,a,\n", "f.csv:3: buffer 'b' (arena 1) aliases buffer 'a' in another arena");
    BAD("a,0,3,8,0,0,,1\nb,2,5,8,0,0,a,\n", "f.csv:3: buffer 'b': its alias buffer 'a' is a group member");
    BAD("a,0,3,8,0,0,,\nb,2,5,8,0,0,a,1\n", "f.csv:3: buffer 'b': a group member cannot be an alias");
    BAD("a,0,3,8,0,0,,\nb,2,5,8,0,0,a,\nc,2,5,8,0,0,a,\n", "f.csv:4: buffer 'c': buffer 'a' is already aliased");
    BAD("a,0,3,8,0,0,,\nb,2,5,8,0,1,a,\n", "f.csv:3: buffer 'b' is unplanned but aliases buffer 'a'");
    BAD("a,0,3,8,0,1,,1\n", "f.csv:2: buffer 'a': a group member cannot be unplanned");
    BAD("a,0,3,8,0,0,,\na,2,5,8,0,0,a,\n", "f.csv:3: id 'a' already used on line 2");
    BAD("a,0,3,8,0,0,a,\n", "f.csv:2: buffer 'a' aliases itself");
#undef BAD
    csv_expect("id,lower,upper,size,key\na,0,3,8,-1\n", "f.csv:2: bad key");
}

int main(void)
{
    in_place();
    verifier();
    arenas_and_unplanned();
    reuse();
    double_cursor();
    bad_input();
    csv();
    TEST_DONE();
}
