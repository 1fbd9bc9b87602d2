/*
 * floor.c: the cost floor for `make bench`. Not part of redis-rl; built by the bench only.
 *
 * FL.GCRA key burst rate period   (three plain integers; period in whole seconds)
 *
 * A minimal native GCRA limiter written straight against redismodule.h: it does the least that
 * any native GCRA limiter on Redis 7.0's module API must do per call, and nothing else, so that
 * the bench can say how far RL.GCRA (and every other RL command) is from that least:
 *
 *   1. parse its three parameters (a limiter must: they are the client's bytes);
 *   2. read the wall clock once (clock_gettime(CLOCK_REALTIME): 7.0 gives modules no
 *      sub-millisecond wall-clock time of its own);
 *   3. open the key for reading and writing, and tell "ours", "missing" and "another type" apart
 *      (WRONGTYPE);
 *   4. GCRA in 64-bit integer nanoseconds, as docs/reference.md#r-gcra-1 states it for QUANTITY 1;
 *   5. if allowed: store the new state in a 16-byte native value (in place when the key exists,
 *      one allocation when it does not), set the key's absolute expiry to the TAT, signal the
 *      key as modified (WATCH), and replicate the effect as one two-argument command
 *      (FL.APPLY key <16 bytes>), which is idempotent and reads no clock;
 *   6. reply with the five-integer array (allowed, limit, remaining, retry_after_ms,
 *      reset_after_ms).
 *
 * A denied request writes, signals and replicates nothing (the module sets
 * REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED, so closing the key is not a "write").
 *
 * Left out on purpose, because RL.GCRA's extra features are what the floor is measured against:
 * QUANTITY / PEEK / MAXWAIT and any other option, decimal periods, conversion of a state built
 * under other parameters (the floor stores the emission interval but ignores it on read),
 * keyspace notifications, INFO counters, a panic boundary, the check that a state would load
 * back, error messages that name the key.
 *
 * The data type `rlfloor00` is a real type: RDB save/load, AOF rewrite, memory usage and free.
 *
 * The command names are as long as redis-rl's (FL.GCRA / RL.GCRA, FL.APPLY / RL.APPLY): Redis
 * hashes and compares the name of every command it runs and of every command a module
 * replicates, and under callgrind three more letters in each name cost about 150 instructions
 * per call, which would make the floor look slower than it is.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "redismodule.h"

#define NS_PER_MS 1000000ULL
#define NS_PER_S 1000000000ULL
#define MAX_PERIOD_S 315360000LL /* ten 365-day years, as docs/reference.md#r-arg-1 */
#define VALUE_BYTES 16
#define ENCODING_VERSION 0

static RedisModuleType *FloorType;

/* The value: the theoretical arrival time (TAT) and the emission interval it was built under,
 * both in ns. 16 bytes, one allocation per key. */
typedef struct {
    uint64_t tat_ns;
    uint64_t interval_ns;
} FloorValue;

/* The replicated effect and AOF form: both words little-endian, whatever the host. */
static void encode(const FloorValue *v, unsigned char out[VALUE_BYTES]) {
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(v->tat_ns >> (8 * i));
        out[8 + i] = (unsigned char)(v->interval_ns >> (8 * i));
    }
}

static void decode(const unsigned char in[VALUE_BYTES], FloorValue *v) {
    v->tat_ns = 0;
    v->interval_ns = 0;
    for (int i = 0; i < 8; i++) {
        v->tat_ns |= (uint64_t)in[i] << (8 * i);
        v->interval_ns |= (uint64_t)in[8 + i] << (8 * i);
    }
}

/* ms since the epoch, rounded up: the key expires exactly when its state equals a missing key. */
static mstime_t ceil_ms(uint64_t ns) {
    return (mstime_t)(ns / NS_PER_MS + (ns % NS_PER_MS != 0));
}

/* Looks at the open key: 1 with *out set for a value of ours, 0 for a missing key, -1 for a key
 * of another type. */
static int read_value(RedisModuleKey *key, FloorValue **out) {
    if (RedisModule_ModuleTypeGetType(key) == FloorType) {
        *out = RedisModule_ModuleTypeGetValue(key);
        return 1;
    }
    *out = NULL;
    return RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_EMPTY ? 0 : -1;
}

/* Makes *v the key's state: in place when the key holds our value, else a new value. */
static void store(RedisModuleKey *key, FloorValue *held, const FloorValue *v) {
    if (held) {
        *held = *v;
        return;
    }
    FloorValue *fresh = RedisModule_Alloc(sizeof(*fresh));
    *fresh = *v;
    RedisModule_ModuleTypeSetValue(key, FloorType, fresh);
}

/* Reads a positive integer argument in [1, max]. */
static int positive(RedisModuleString *arg, long long max, long long *out) {
    return RedisModule_StringToLongLong(arg, out) == REDISMODULE_OK && *out >= 1 && *out <= max;
}

/* FL.GCRA key burst rate period */
static int FloorGcra_Command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5) return RedisModule_WrongArity(ctx);

    /* 1. Parameters. */
    long long burst, rate, period_s;
    if (!positive(argv[2], INT64_MAX, &burst))
        return RedisModule_ReplyWithError(ctx, "ERR burst must be a positive integer");
    if (!positive(argv[3], INT64_MAX, &rate))
        return RedisModule_ReplyWithError(ctx, "ERR rate must be a positive integer");
    if (!positive(argv[4], MAX_PERIOD_S, &period_s))
        return RedisModule_ReplyWithError(ctx, "ERR period must be a positive integer of seconds");
    /* Emission interval T = period / rate, rounded to the nearest ns; tolerance tau = burst * T. */
    uint64_t period_ns = (uint64_t)period_s * NS_PER_S; /* <= 3.2e17, no overflow */
    uint64_t interval = (period_ns + (uint64_t)rate / 2) / (uint64_t)rate;
    uint64_t tolerance;
    if (interval == 0) return RedisModule_ReplyWithError(ctx, "ERR rate too high for the period");
    if (__builtin_mul_overflow((uint64_t)burst, interval, &tolerance))
        return RedisModule_ReplyWithError(ctx, "ERR burst * period / rate overflows");

    /* 2. Clock. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;

    /* 3. Key. */
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    FloorValue *held;
    int found = read_value(key, &held);
    if (found < 0) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }

    /* 4. GCRA, quantity 1: tat = max(stored, now); allowed iff tat + T - now <= tau. */
    uint64_t tat = (found && held->tat_ns > now) ? held->tat_ns : now;
    uint64_t new_tat;
    if (__builtin_add_overflow(tat, interval, &new_tat)) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, "ERR time overflow");
    }
    int allowed = new_tat - now <= tolerance;
    uint64_t tat_after = allowed ? new_tat : tat;
    uint64_t in_use = tat_after - now;
    long long remaining = (long long)((tolerance > in_use ? tolerance - in_use : 0) / interval);
    long long retry_after_ms = allowed ? -1 : (long long)ceil_ms(new_tat - now - tolerance);
    if (retry_after_ms == 0) retry_after_ms = 1;
    long long reset_after_ms = (long long)ceil_ms(in_use);

    /* 5. The write, only when allowed. */
    if (allowed) {
        FloorValue v = {new_tat, interval};
        store(key, held, &v);
        RedisModule_SetAbsExpire(key, ceil_ms(new_tat));
        RedisModule_SignalModifiedKey(ctx, argv[1]);
        unsigned char effect[VALUE_BYTES];
        encode(&v, effect);
        RedisModule_Replicate(ctx, "FL.APPLY", "sb", argv[1], (const char *)effect,
                              (size_t)VALUE_BYTES);
    }
    RedisModule_CloseKey(key);

    /* 6. Reply. */
    RedisModule_ReplyWithArray(ctx, 5);
    RedisModule_ReplyWithLongLong(ctx, allowed);
    RedisModule_ReplyWithLongLong(ctx, burst);
    RedisModule_ReplyWithLongLong(ctx, remaining);
    RedisModule_ReplyWithLongLong(ctx, retry_after_ms);
    RedisModule_ReplyWithLongLong(ctx, reset_after_ms);
    return REDISMODULE_OK;
}

/* FL.APPLY key <16 bytes>: stores a state and its expiry (at the TAT). Only the replication
 * stream and AOF loading may send it. */
static int FloorApply_Command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    if (!(RedisModule_GetContextFlags(ctx) &
          (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)))
        return RedisModule_ReplyWithError(ctx, "ERR FL.APPLY is internal");
    size_t len;
    const char *bytes = RedisModule_StringPtrLen(argv[2], &len);
    if (len != VALUE_BYTES) return RedisModule_ReplyWithError(ctx, "ERR bad FL.APPLY value");
    FloorValue v;
    decode((const unsigned char *)bytes, &v);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    FloorValue *held;
    if (read_value(key, &held) < 0) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    store(key, held, &v);
    RedisModule_SetAbsExpire(key, ceil_ms(v.tat_ns));
    RedisModule_SignalModifiedKey(ctx, argv[1]);
    RedisModule_CloseKey(key);
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* The type's callbacks. */
static void *floor_rdb_load(RedisModuleIO *io, int encver) {
    if (encver != ENCODING_VERSION) return NULL;
    uint64_t tat = RedisModule_LoadUnsigned(io);
    uint64_t interval = RedisModule_LoadUnsigned(io);
    if (RedisModule_IsIOError(io)) return NULL;
    FloorValue *v = RedisModule_Alloc(sizeof(*v));
    v->tat_ns = tat;
    v->interval_ns = interval;
    return v;
}

static void floor_rdb_save(RedisModuleIO *io, void *value) {
    const FloorValue *v = value;
    RedisModule_SaveUnsigned(io, v->tat_ns);
    RedisModule_SaveUnsigned(io, v->interval_ns);
}

static void floor_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, void *value) {
    unsigned char bytes[VALUE_BYTES];
    encode(value, bytes);
    RedisModule_EmitAOF(aof, "FL.APPLY", "sb", key, (const char *)bytes, (size_t)VALUE_BYTES);
}

static size_t floor_mem_usage(const void *value) {
    (void)value;
    return sizeof(FloorValue);
}

static void floor_free(void *value) {
    RedisModule_Free(value);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "rlfloor", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    /* Needed on 7.0: the API table is filled from the server, and these two are 7.0 additions. */
    if (!RedisModule_SetAbsExpire || !RedisModule_SetModuleOptions) return REDISMODULE_ERR;
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTIONS_HANDLE_IO_ERRORS |
                                          REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    RedisModuleTypeMethods methods = {
        .version = 1, /* only the version-1 callbacks below; 7.0 reads nothing more */
        .rdb_load = floor_rdb_load,
        .rdb_save = floor_rdb_save,
        .aof_rewrite = floor_aof_rewrite,
        .mem_usage = floor_mem_usage,
        .free = floor_free,
    };
    FloorType = RedisModule_CreateDataType(ctx, "rlfloor00", ENCODING_VERSION, &methods);
    if (FloorType == NULL) return REDISMODULE_ERR;
    /* Key at argument 1 only (Redis derives the key spec from first = last = 1, step 1). */
    if (RedisModule_CreateCommand(ctx, "fl.gcra", FloorGcra_Command, "write deny-oom fast", 1,
                                  1, 1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "fl.apply", FloorApply_Command, "write deny-oom", 1, 1,
                                  1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
