// ctest-labels: unit
/* vmm-plan from the command line: bad input and bad options exit 2 with a message that names the
 * problem (the file and line for a malformed CSV), a capacity that cannot be met exits 1, and
 * --capacity ID=B reaches the arena it names (and only it). Runs the built tool
 * ($VMM_BINARY_DIR/tools/vmm-plan) through the shell, as a user would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static char tool[1024], dir[1024];
static char out[65536];

/* Run vmm-plan ARGS (stdout and stderr together into out); its exit status. */
static int run(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", tool, args);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Exit status want and a message containing text. */
static void expect(const char *args, int want, const char *text)
{
    int st = run(args);
    if (st != want || !strstr(out, text)) {
        fprintf(stderr, "vmm-plan %s: exit %d (want %d), output:\n%s(want it to contain '%s')\n", args, st, want,
                out, text);
        CHECK(0);
    }
}

static void write_file(const char *name, const char *text)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

/* The capacity the JSON gives arena id, or -1 when it lists no such arena. */
static long long json_capacity(unsigned id)
{
    char key[64];
    snprintf(key, sizeof key, "{\"id\": %u,", id);
    const char *a = strstr(out, key);
    if (!a)
        return -1;
    const char *c = strstr(a, "\"capacity\": ");
    CHECK(c != NULL);
    return atoll(c + strlen("\"capacity\": "));
}

int main(void)
{
    const char *bin = getenv("VMM_BINARY_DIR");
    CHECK(bin != NULL); /* set by ctest (tests/CMakeLists.txt) */
    snprintf(tool, sizeof tool, "%s/tools/vmm-plan", bin);
    FILE *t = fopen(tool, "r");
    if (!t) {
        fprintf(stderr, "%s: not built\n", tool);
        CHECK(0);
    }
    fclose(t);
    snprintf(dir, sizeof dir, "%s/test_plan_cli.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(dir) != NULL);

    /* Two arenas: arena 0's bound is 300 (a and b live together), arena 1's is 50. */
    write_file("two.csv", "id,lower,upper,size,arena\n"
                          "a,0,2,100,0\n"
                          "b,1,3,200,0\n"
                          "c,0,3,50,1\n");
    write_file("bad_num.csv", "id,lower,upper,size\n"
                              "a,0,2,100\n"
                              "b,1,x,200\n");
    write_file("bad_fields.csv", "id,lower,upper,size\n"
                                 "a,0,2\n");
    write_file("bad_arena.csv", "id,lower,upper,size,arena\n"
                                "a,0,2,100,99\n");
    write_file("bad_header.csv", "name,start\n"
                                 "a,0\n");
    write_file("empty.csv", "");
    char a[4096];

    /* Usage. */
    expect("", 2, "usage: vmm-plan");
    expect("--help", 0, "usage: vmm-plan");
    expect("--bogus", 2, "unknown or incomplete option '--bogus'");
    snprintf(a, sizeof a, "%s/two.csv %s/two.csv", dir, dir);
    expect(a, 2, "more than one input file");

    /* Bad files: the file and the line. */
    snprintf(a, sizeof a, "%s/missing.csv", dir);
    expect(a, 2, "missing.csv");
    snprintf(a, sizeof a, "%s/bad_num.csv", dir);
    expect(a, 2, "bad_num.csv:3:");
    snprintf(a, sizeof a, "%s/bad_fields.csv", dir);
    expect(a, 2, "bad_fields.csv:2: 3 fields, the header has 4");
    snprintf(a, sizeof a, "%s/bad_arena.csv", dir);
    expect(a, 2, "bad_arena.csv:2: unknown arena '99'");
    snprintf(a, sizeof a, "%s/bad_header.csv", dir);
    expect(a, 2, "bad_header.csv:1: header must name id,lower,upper,size");
    snprintf(a, sizeof a, "%s/empty.csv", dir);
    expect(a, 2, "empty input");

    /* Bad option values. */
    struct {
        const char *opt, *msg;
    } bad[] = {
        {"--algo nope", "nope"},
        {"--time-limit -1", "bad --time-limit '-1'"},
        {"--time-limit x", "bad --time-limit 'x'"},
        {"--node-limit -5", "bad --node-limit '-5'"},
        {"--node-limit 12x", "bad --node-limit '12x'"},
        {"--threads 5000", "bad --threads '5000'"},
        {"--long-lived 2", "bad --long-lived '2'"},
        {"--capacity abc", "bad --capacity 'abc'"},
        {"--capacity -5", "bad --capacity '-5'"},
        {"--capacity 1=", "bad --capacity '1='"},
        {"--capacity 1=0", "bad --capacity '1=0'"},
        {"--capacity 1=-5", "bad --capacity '1=-5'"},
        {"--capacity 1=5k", "bad --capacity '1=5k'"},
        {"--capacity x=5", "bad --capacity 'x=5' (ID=BYTES, ID from 0 to 15)"},
        {"--capacity 16=5", "bad --capacity '16=5' (ID=BYTES, ID from 0 to 15)"},
        {"--capacity -1=5", "bad --capacity '-1=5'"},
        {"--capacity 3=1000", "--capacity 3=1000: unknown arena 3"},
        {"--capacity", "unknown or incomplete option '--capacity'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(a, sizeof a, "%s/two.csv %s", dir, bad[k].opt);
        expect(a, 2, bad[k].msg);
    }
    expect("--generate spiral --buffers 10", 2, "unknown cut style 'spiral'");
    expect("--generate guillotine --buffers -3", 2, "bad --buffers '-3'");
    expect("--generate guillotine --buffers 0", 2, "buffer count 0 not in 1..100000");

    /* The plan without capacities: arena 0 at 300, arena 1 at 50, no capacity in the JSON. */
    snprintf(a, sizeof a, "%s/two.csv --json", dir);
    CHECK_EQ(run(a), 0);
    CHECK(strstr(out, "\"fits_capacity\": true") != NULL);
    CHECK_EQ(json_capacity(0), 0);
    CHECK_EQ(json_capacity(1), 0);
    CHECK(strstr(out, "\"id\": 0, \"buffers\": 2, \"arena_bytes\": 300") != NULL);
    CHECK(strstr(out, "\"id\": 1, \"buffers\": 1, \"arena_bytes\": 50") != NULL);

    /* ID=B reaches that arena alone; repeated, each its own. */
    snprintf(a, sizeof a, "%s/two.csv --capacity 1=64 --json", dir);
    CHECK_EQ(run(a), 0);
    CHECK_EQ(json_capacity(0), 0);
    CHECK_EQ(json_capacity(1), 64);
    snprintf(a, sizeof a, "%s/two.csv --capacity 0=4096 --capacity 1=64 --json", dir);
    CHECK_EQ(run(a), 0);
    CHECK_EQ(json_capacity(0), 4096);
    CHECK_EQ(json_capacity(1), 64);
    CHECK(strstr(out, "\"fits_capacity\": true") != NULL);

    /* A capacity below an arena's bound: exit 1, said so, the plan still printed. */
    snprintf(a, sizeof a, "%s/two.csv --capacity 0=299 --json", dir);
    CHECK_EQ(run(a), 1);
    CHECK(strstr(out, "arena 0: best found plan of 300 bytes exceeds capacity 299") != NULL);
    CHECK(strstr(out, "\"fits_capacity\": false") != NULL);
    CHECK_EQ(json_capacity(0), 299);
    CHECK_EQ(json_capacity(1), 0);
    /* the same bytes for arena 1 fit: the capacity went to arena 1 only */
    snprintf(a, sizeof a, "%s/two.csv --capacity 1=299 --json", dir);
    CHECK_EQ(run(a), 0);
    CHECK(strstr(out, "\"fits_capacity\": true") != NULL);
    /* B alone: every arena */
    snprintf(a, sizeof a, "%s/two.csv --capacity 100 --json", dir);
    CHECK_EQ(run(a), 1);
    CHECK(strstr(out, "\"fits_capacity\": false") != NULL);
    snprintf(a, sizeof a, "%s/two.csv --capacity 300 --json", dir);
    CHECK_EQ(run(a), 0);
    CHECK_EQ(json_capacity(0), 300);
    CHECK_EQ(json_capacity(1), 300);

    const char *names[] = {"two.csv", "bad_num.csv", "bad_fields.csv", "bad_arena.csv", "bad_header.csv", "empty.csv"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        CHECK(remove(path) == 0);
    }
    CHECK(rmdir(dir) == 0);
    TEST_DONE();
}
