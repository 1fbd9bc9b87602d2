package redisrl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client makes rate-limit decisions in Redis, shared by every process of a service.
//
// Decisions come from the redis-rl module when the server has it, else from the project's
// Lua library (the same replies; see Mode). When Redis does not answer, the FailurePolicy
// does. A Client is safe for concurrent use; build one per Redis deployment and share it.
type Client struct {
	rdb         redis.UniversalClient
	cluster     *redis.ClusterClient // nil unless rdb is one
	modeSetting Mode
	prefix      string
	timeout     time.Duration
	loadLibrary bool
	ctxDeadline bool // the go-redis client honours context deadlines on reads

	resolved     atomic.Uint32 // 0: not detected; 1: module; 2: fallback
	libraryReady atomic.Bool
	detectMu     sync.Mutex
	// The fallback runs as a script (no Functions library here): EVAL first, EVALSHA once
	// a server was sent the text (scriptCached). evalRefused: EVAL is renamed away or
	// denied, so the text goes by SCRIPT LOAD and calls by EVALSHA; evalshaRefused: every
	// call sends the text (docs/clients.md#the-fallback-where-users-are).
	scripts        atomic.Bool
	scriptCached   atomic.Bool
	evalRefused    atomic.Bool
	evalshaRefused atomic.Bool

	counters  Counters
	health    health
	denyCache *denyCache
	memory    *memoryStore // FailLocal's limits (nil under the other policies)
	fleet     uint64       // FailLocal divides each limit by it
	batch     *batcher     // nil unless WithBatch(k) with k > 1
}

type config struct {
	mode             Mode
	policy           FailurePolicy
	prefix           string
	timeout          time.Duration
	probeInterval    time.Duration
	closedRetryAfter time.Duration
	loadLibrary      bool
	denyCache        bool
	hook             Hook
	logger           *slog.Logger
	fleetSize        uint64
	batch            uint64
	hasBatch         bool
	batchHold        time.Duration
}

// Option configures a Client (New).
type Option func(*config)

// WithMode chooses the module, the fallback, or detection (ModeAuto, the default).
func WithMode(m Mode) Option { return func(c *config) { c.mode = m } }

// WithFailurePolicy says what a check answers when Redis does not (FailOpen by default).
func WithFailurePolicy(p FailurePolicy) Option { return func(c *config) { c.policy = p } }

// WithPrefix is prepended to every key sent (no braces: it would become the hash tag).
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithTimeout bounds each Redis call (500 ms by default: it holds on a loaded host). A call
// that runs out of it is an outage, answered by the failure policy; the caller's own
// context deadline, when earlier, is honoured too and returned as the context's error.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithProbeInterval is how long, after a failed call, checks are answered by the policy
// without trying Redis (1 s by default); the first call after it tries again.
func WithProbeInterval(d time.Duration) Option { return func(c *config) { c.probeInterval = d } }

// WithClosedRetryAfter is the RetryAfter of FailClosed's denials (1 s by default).
func WithClosedRetryAfter(d time.Duration) Option {
	return func(c *config) { c.closedRetryAfter = d }
}

// WithLoadLibrary allows (the default) or forbids loading the Lua library with FUNCTION
// LOAD when the fallback finds it missing or older than this package's.
func WithLoadLibrary(allowed bool) Option { return func(c *config) { c.loadLibrary = allowed } }

// WithDenyCache turns the local deny cache on (the default) or off.
func WithDenyCache(on bool) Option { return func(c *config) { c.denyCache = on } }

// WithFleetSize is the number of processes sharing the limits, for FailLocal: while Redis is
// unreachable each process enforces each limit divided by n (rounding down, at least 1; a
// GCRA's burst and its rate, a window's or a lease's limit), so the fleet stays near the
// limit (docs/clients.md#failure-policy-local). 1 by default; 0 is refused.
func WithFleetSize(n uint64) Option { return func(c *config) { c.fleetSize = n } }

// WithBatch turns batching on (docs/clients.md#batching-optional; off by default): a
// Check of a GCRA, FIXED or SLIDING limit takes up to k units in one Redis call (QUANTITY
// k, at most the limit's capacity), admits later requests of the same key and limit from
// them in this process without a call (Source SourceLocal, counted as allowed_locally), and
// gives back (RL.REFUND) what is left once the hold (WithBatchHold) has passed, or on
// Close. Every local admission was paid for in Redis first, so the fleet never admits more
// than the limit; the cost is that up to k−1 units per process and key may sit unused for
// the hold. Units of a window are used and refunded only inside the window they were paid
// in, GCRA units only while the bucket cannot have drained past them; what cannot be
// refunded exactly lapses (under-admits, never over-admits).
//
// Not batched, as in the Rust crate: LOG windows, leases, CheckAll, and checks with Peek,
// Force, MaxWait, or a cost of k or more (each is its own call). k = 1 is no batching; k = 0
// is refused by New with an error matching ErrInvalidLimit ("batch must be a positive
// integer").
func WithBatch(k uint64) Option { return func(c *config) { c.batch, c.hasBatch = k, true } }

// WithBatchHold is how long unused batch units are held before they are refunded (100 ms
// by default); a duration that is not positive or is longer than MaxSeconds is refused by
// New (ErrUsage).
func WithBatchHold(d time.Duration) Option { return func(c *config) { c.batchHold = d } }

// WithHook calls hook(counterName, n) on every counter increment.
func WithHook(hook Hook) Option { return func(c *config) { c.hook = hook } }

// WithLogger sets the logger of the one line per outage and its recovery (slog.Default()
// by default).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// New builds a Client on a go-redis client: *redis.Client (one server, or a failover client
// from redis.NewFailoverClient), *redis.ClusterClient, or any redis.UniversalClient. It does
// not talk to Redis; the mode is detected on the first call.
//
// Options are validated here: a bad one is an error matching ErrUsage.
func New(rdb redis.UniversalClient, opts ...Option) (*Client, error) {
	if rdb == nil {
		return nil, usage("New needs a go-redis client")
	}
	cfg := config{
		timeout:          500 * time.Millisecond,
		probeInterval:    time.Second,
		closedRetryAfter: time.Second,
		loadLibrary:      true,
		denyCache:        true,
		fleetSize:        1,
		batchHold:        100 * time.Millisecond,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if strings.ContainsAny(cfg.prefix, "{}") {
		return nil, usage("prefix must not contain '{' or '}' (it would become the hash tag)")
	}
	for _, d := range []struct {
		v    time.Duration
		name string
	}{{cfg.timeout, "timeout"}, {cfg.probeInterval, "probe interval"}, {cfg.closedRetryAfter, "closed retry after"}, {cfg.batchHold, "batch hold"}} {
		if d.v <= 0 || d.v > maxSpan {
			return nil, usage("%s must be a positive duration of at most %d s", d.name, MaxSeconds)
		}
	}
	if cfg.mode > ModeFallback {
		return nil, usage("unknown mode %d", cfg.mode)
	}
	switch cfg.policy {
	case FailOpen, FailClosed, FailError, FailLocal:
	default:
		return nil, usage("unknown failure policy %d", cfg.policy)
	}
	if cfg.hasBatch && cfg.batch == 0 {
		return nil, invalid("batch must be a positive integer")
	}
	if cfg.fleetSize == 0 {
		return nil, usage("fleet size must be at least 1 (the number of processes sharing the limits)")
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	c := &Client{
		rdb:         rdb,
		modeSetting: cfg.mode,
		prefix:      cfg.prefix,
		timeout:     cfg.timeout,
		loadLibrary: cfg.loadLibrary,
	}
	switch r := rdb.(type) {
	case *redis.Client:
		c.ctxDeadline = r.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		c.cluster = r
		c.ctxDeadline = r.Options().ContextTimeoutEnabled
	}
	c.counters.hook = cfg.hook
	c.health = health{policy: cfg.policy, probeInterval: cfg.probeInterval, closedRetryAfter: cfg.closedRetryAfter, logger: cfg.logger}
	if cfg.denyCache {
		c.denyCache = newDenyCache(10_000)
	}
	c.fleet = cfg.fleetSize
	if cfg.batch > 1 {
		c.batch = newBatcher(cfg.batch, cfg.batchHold)
	}
	if cfg.policy == FailLocal {
		c.memory = newMemoryStore(100_000, nil)
	}
	return c, nil
}

// Counters are the client's counters (docs/clients.md#counters).
func (c *Client) Counters() *Counters { return &c.counters }

// Prefix is the prefix prepended to every key.
func (c *Client) Prefix() string { return c.prefix }

// IsCluster reports whether the client talks to a Redis Cluster (a *redis.ClusterClient),
// where keys of different hash tags cannot share one RL.ALL.
func (c *Client) IsCluster() bool { return c.cluster != nil }

// FailurePolicy is the client's failure policy.
func (c *Client) FailurePolicy() FailurePolicy { return c.health.policy }

// ResolvedMode is the mode in use (ModeModule or ModeFallback), detecting it if needed (and
// loading the fallback library if it is missing and allowed).
func (c *Client) ResolvedMode(ctx context.Context) (Mode, error) {
	return c.mode(ctx)
}

// -- options of one call ----------------------------------------------------------------

type checkOptions struct {
	cost        uint64
	peek        bool
	force       bool
	maxWait     time.Duration
	hasWait     bool
	acrossSlots bool
}

// CheckOption is an option of one Check or CheckAll.
type CheckOption func(*checkOptions)

// Cost is the units this request costs (default 1; 0 only reports the key's state). For
// CheckAll, the quantity of every entry without its own cost.
func Cost(n uint64) CheckOption { return func(o *checkOptions) { o.cost = n } }

// Peek evaluates exactly as a real request and writes nothing (a dry run).
func Peek() CheckOption { return func(o *checkOptions) { o.peek = true } }

// Force records usage that already happened, allowed or not (FORCE; not for LOG).
func Force() CheckOption { return func(o *checkOptions) { o.force = true } }

// MaxWait makes a GCRA check a reservation (MAXWAIT): a request that would be allowed
// within d is admitted now, and the decision's RetryAfter is the wait before acting.
func MaxWait(d time.Duration) CheckOption {
	return func(o *checkOptions) { o.maxWait, o.hasWait = d, true }
}

// AcrossSlots lets a CheckAll on a Redis Cluster take keys in several slots: the limits are
// checked one slot group at a time, in entry order (one RL.ALL each), and when a later group
// denies, what the earlier groups took is given back (RL.REFUND of exactly the charge; a
// lease is released), so a denied request leaves no charge; the later groups are then
// peeked, and the decision is combined as RL.ALL combines. Not atomic: between the charge
// and the refund another request may see the earlier limits charged (it can only be denied
// for it, never admitted past a limit). Keys in one slot, and every call on one server, are
// still one RL.ALL (docs/clients.md#identities-stay-apart).
func AcrossSlots() CheckOption { return func(o *checkOptions) { o.acrossSlots = true } }

func gather(opts []CheckOption) checkOptions {
	o := checkOptions{cost: 1}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

func u(n uint64) string { return strconv.FormatUint(n, 10) }

// -- decisions ----------------------------------------------------------------------------

// Check asks whether one request (cost 1 unless Cost) of limit on key may go ahead now, and
// takes it (RL.GCRA or RL.WINDOW). Options: Cost, Peek, MaxWait (GCRA), Force.
//
// Errors: an invalid limit (ErrInvalidLimit), a misuse (ErrUsage), an error reply that is
// not an outage (WRONGTYPE, a server-side cap), the context's error when ctx ends first, and
// under FailError an outage (ErrUnavailable). Under FailOpen and FailClosed an outage is a
// Degraded decision, not an error.
func (c *Client) Check(ctx context.Context, key string, limit Spec, opts ...CheckOption) (Decision, error) {
	if limit == nil {
		return Decision{}, usage("Check needs a limit")
	}
	s, err := limit.spec()
	if err != nil {
		return Decision{}, err
	}
	o := gather(opts)
	if s.kind == kindLease {
		return Decision{}, usage("a Lease is taken with Acquire, not Check")
	}
	if o.hasWait && s.kind != kindGCRA {
		return Decision{}, usage("MaxWait (MAXWAIT) is offered by GCRA limits only")
	}
	if o.hasWait && o.maxWait < 0 {
		return Decision{}, usage("MaxWait must not be negative")
	}
	full, err := c.fullKey(key)
	if err != nil {
		return Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	opc := opWindow
	if s.kind == kindGCRA {
		opc = opGCRA
	}
	// A request larger than the limit goes to Redis, which answers Never (HTTP 413).
	plain := !o.peek && !o.force && !o.hasWait && o.cost >= 1 && o.cost <= s.capacity
	var ck string
	if plain && (c.denyCache != nil || c.batch != nil) {
		ck = full + "\x00" + s.ident()
	}
	batchK := uint64(0)
	if plain && c.batch != nil {
		if batchK = c.batch.size(s, o.cost); batchK > 0 {
			if d, ok := c.fromCredit(ck, full, limit, s, o.cost); ok {
				return d, nil
			}
		}
	}
	if plain && c.denyCache != nil {
		if d, ok := c.denyCache.lookup(ck, o.cost, time.Now()); ok {
			c.counters.add(cDeniedLocally, 1)
			c.counters.countDecision(d)
			return d, nil
		}
	}
	if batchK > 0 {
		return c.checkBatched(ctx, ck, full, limit, s, o, batchK)
	}
	if c.health.skip() {
		return c.degradedCheck(limit, full, nil, o)
	}
	args := s.args()
	if o.cost != 1 {
		args = append(args, "QUANTITY", u(o.cost))
	}
	if o.peek {
		args = append(args, "PEEK")
	}
	if o.hasWait {
		args = append(args, "MAXWAIT", strconv.FormatInt(o.maxWait.Milliseconds(), 10))
	}
	if o.force {
		args = append(args, "FORCE")
	}
	sent := time.Now()
	v, mode, err := c.guarded(ctx, opc, []string{full}, args)
	if err != nil {
		if errors.Is(err, errDown) {
			return c.degradedCheck(limit, full, errors.Unwrap(err), o)
		}
		return Decision{}, err
	}
	r, err := five(v)
	if err != nil {
		return Decision{}, err
	}
	d := fromReply(r, limit, full, mode.source(), o.hasWait)
	if plain && c.denyCache != nil {
		c.denyCache.store(ck, []string{full}, o.cost, d, sent)
	}
	return c.decided(d), nil
}

// Force records cost units of usage that already happened, allowed or not (RL.GCRA or
// RL.WINDOW ... FORCE; not for LOG, which the server refuses): Check with Cost(cost) and
// Force().
func (c *Client) Force(ctx context.Context, key string, limit Spec, cost uint64) (Decision, error) {
	return c.Check(ctx, key, limit, Cost(cost), Force())
}

// Entry is one limit of a CheckAll: a key, its limit, and optionally its own cost (or, for
// a Lease, its token).
type Entry struct {
	key      string
	limit    Spec
	cost     uint64
	hasCost  bool
	token    string
	hasToken bool
}

// NewEntry is key under limit, at the call's cost.
func NewEntry(key string, limit Spec) Entry { return Entry{key: key, limit: limit} }

// Cost gives this entry its own cost (RL.ALL's COST).
func (e Entry) Cost(n uint64) Entry { e.cost, e.hasCost = n, true; return e }

// Token gives a Lease entry its token (1 to 64 bytes).
func (e Entry) Token(token string) Entry { e.token, e.hasToken = token, true; return e }

// Key is the entry's key (without the client's prefix).
func (e Entry) Key() string { return e.key }

// CheckAll decides one request against several limits atomically (RL.ALL): every limit
// admits it and all are charged, or none is. The combined decision has each key's decision
// in PerKey, in entry order. On a Cluster, give the keys one hash tag ({user42}:rpm,
// {user42}:tpm; see Tag): keys in several slots are an error (CROSSSLOT). Options: Cost
// (the quantity of every entry without its own cost), Peek, Force.
func (c *Client) CheckAll(ctx context.Context, entries []Entry, opts ...CheckOption) (Decision, error) {
	if len(entries) == 0 {
		return Decision{}, usage("CheckAll needs at least one entry")
	}
	o := gather(opts)
	if o.hasWait {
		return Decision{}, usage("MaxWait (MAXWAIT) is offered by Check on a GCRA limit only")
	}
	keys := make([]string, len(entries))
	specs := make([]spec, len(entries))
	seen := make(map[string]bool, len(entries))
	for i, e := range entries {
		if e.limit == nil {
			return Decision{}, usage("entry %d has no limit", i+1)
		}
		s, err := e.limit.spec()
		if err != nil {
			return Decision{}, err
		}
		if s.kind == kindLease && !e.hasToken {
			return Decision{}, usage("the Lease entry for %q needs a Token", e.key)
		}
		if e.hasToken {
			if s.kind != kindLease {
				return Decision{}, usage("only a Lease entry takes a Token (%q)", e.key)
			}
			if err := checkToken(e.token); err != nil {
				return Decision{}, err
			}
		}
		full, err := c.fullKey(e.key)
		if err != nil {
			return Decision{}, err
		}
		if seen[full] {
			return Decision{}, usage("key %q is given twice", e.key)
		}
		seen[full] = true
		keys[i], specs[i] = full, s
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	if o.acrossSlots && c.cluster != nil {
		if groups := slotGroups(keys); len(groups) > 1 {
			return c.checkAcrossSlots(ctx, entries, keys, specs, groups, o)
		}
	}
	return c.checkAll(ctx, entries, keys, specs, o, true)
}

// checkAll is one RL.ALL of validated entries (keys with the prefix).
// count false leaves the counters to the caller (one decision of several calls).
func (c *Client) checkAll(ctx context.Context, entries []Entry, keys []string, specs []spec, o checkOptions, count bool) (Decision, error) {
	if c.health.skip() {
		return c.degradedAll(entries, keys, nil, o, count)
	}
	var args []any
	for i, s := range specs {
		args = append(args, s.head())
		args = append(args, s.args()...)
		if entries[i].hasToken {
			args = append(args, entries[i].token)
		}
		if entries[i].hasCost {
			args = append(args, "COST", u(entries[i].cost))
		}
	}
	if o.cost != 1 {
		args = append(args, "QUANTITY", u(o.cost))
	}
	if o.peek {
		args = append(args, "PEEK")
	}
	if o.force {
		args = append(args, "FORCE")
	}
	v, mode, err := c.guarded(ctx, opAll, keys, args)
	if err != nil {
		if errors.Is(err, errDown) {
			return c.degradedAll(entries, keys, errors.Unwrap(err), o, count)
		}
		return Decision{}, err
	}
	combined, each, err := allReply(v)
	if err != nil {
		return Decision{}, err
	}
	if len(each) != len(entries) {
		return Decision{}, protocolError(fmt.Sprintf("%d per-key replies", len(entries)), v)
	}
	d := fromReply(combined, nil, "", mode.source(), false)
	d.PerKey = make([]Decision, len(entries))
	for i, r := range each {
		d.PerKey[i] = fromReply(r, entries[i].limit, keys[i], mode.source(), false)
	}
	d.Spec = binding(d)
	if !count {
		c.health.success()
		return d, nil
	}
	return c.decided(d), nil
}

// binding is the limit of a combined decision: the per-key decision whose figures it
// reports.
func binding(d Decision) Spec {
	for _, p := range d.PerKey {
		if p.Limit == d.Limit && p.Remaining == d.Remaining {
			return p.Spec
		}
	}
	return nil
}

// Refunded is what RL.REFUND (or RL.RELEASE) gave back.
type Refunded struct {
	// Units given back (slots freed, for a release), wherever they went.
	Units uint64
	// Remaining and ResetAfter are the key's figures after it: Redis's when Redis took part
	// of it, else the in-memory limiter's (FailLocal).
	Remaining  uint64
	ResetAfter time.Duration
	// Degraded: Redis gave nothing back. Either it did not answer (nothing was given back,
	// except in FailLocal's memory), or under FailLocal the whole refund went back to the
	// in-memory limiter that took the charge.
	Degraded bool
}

// Refund gives back up to n units to key (RL.REFUND), and forgets this client's local
// denials of it. n must be at least 1.
//
// Under FailLocal a refund goes back where the charge was taken: the units the in-memory
// limiter charged key during an outage and has not given back yet are given back there
// first, even once Redis answers again (Redis never had them: refunding them there would
// give back other requests' units), and only the rest of n goes to Redis. The in-memory
// limiter remembers those units as long as it holds the key (until the key is idle, as its
// Redis twin would expire). A key charged both during an outage and after it is refunded in
// memory first; a refund misplaced that way only under-admits. RefundDecision refunds the
// charge of one decision exactly where it was taken.
func (c *Client) Refund(ctx context.Context, key string, n uint64) (Refunded, error) {
	if n == 0 {
		return Refunded{}, invalid("quantity must be a positive integer")
	}
	full, err := c.fullKey(key)
	if err != nil {
		return Refunded{}, err
	}
	if err := ctx.Err(); err != nil {
		return Refunded{}, err
	}
	if c.denyCache != nil {
		c.denyCache.forget(full)
	}
	var local Refunded
	if c.memory != nil {
		if taken, m := c.memory.refundOwed(full, n, true); taken > 0 {
			local = Refunded{Units: nonNeg(m[0]), Remaining: nonNeg(m[1]), ResetAfter: msDuration(m[2]), Degraded: true}
			c.counters.add(cRefunded, local.Units)
			if n -= taken; n == 0 {
				return local, nil
			}
		}
	}
	r, err := c.report(ctx, opRefund, full, u(n), true)
	if err == nil && r.Units > 0 {
		c.counters.add(cRefunded, r.Units)
	}
	if local.Units > 0 || local.Degraded {
		if err != nil {
			return local, err
		}
		r.Units += local.Units
	}
	return r, err
}

// RefundDecision gives back up to n units of the charge d took, where d took it: to
// FailLocal's in-memory limiter when d is its decision (Degraded, not Blind: taken in memory
// during an outage), even if Redis answers again; nothing when d is Blind (the open or
// closed policy charged nothing); else to Redis (RL.REFUND), and when Redis does not answer
// the refund is lost (it only under-admits), never taken from memory. It forgets this
// client's local denials of d's key. d is one key's decision this client returned (Check,
// Force, Allow, or one of a CheckAll's PerKey); a combined decision, a lease's and a
// decision without a key are refused (ErrUsage). n must be at least 1.
func (c *Client) RefundDecision(ctx context.Context, d Decision, n uint64) (Refunded, error) {
	if n == 0 {
		return Refunded{}, invalid("quantity must be a positive integer")
	}
	if d.PerKey != nil || d.Key == "" {
		return Refunded{}, usage("RefundDecision needs one key's decision (of a CheckAll, each of its PerKey)")
	}
	if _, lease := d.Spec.(Lease); lease {
		return Refunded{}, usage("a lease is given back with Release, not RefundDecision")
	}
	if err := ctx.Err(); err != nil {
		return Refunded{}, err
	}
	if c.denyCache != nil {
		c.denyCache.forget(d.Key)
	}
	r, err := c.refundTo(ctx, d, d.Key, n)
	if err == nil {
		c.counters.add(cRefunded, r.Units)
	}
	return r, err
}

// takenLocally reports whether d's charge was taken by FailLocal's in-memory limiter.
func (c *Client) takenLocally(d Decision) bool {
	return c.memory != nil && d.Degraded && !d.Blind
}

// refundTo gives back n units of full's charge where decision d took it (the counters are
// the caller's).
func (c *Client) refundTo(ctx context.Context, d Decision, full string, n uint64) (Refunded, error) {
	switch {
	case d.Blind:
		return Refunded{Degraded: true}, nil
	case c.takenLocally(d):
		_, m := c.memory.refundOwed(full, n, false)
		return Refunded{Units: nonNeg(m[0]), Remaining: nonNeg(m[1]), ResetAfter: msDuration(m[2]), Degraded: true}, nil
	}
	return c.report(ctx, opRefund, full, u(n), false)
}

// Release frees the lease token holds on key (RL.RELEASE); harmless twice. Under
// FailLocal a lease the in-memory limiter granted during an outage is freed there too,
// also once Redis answers again (Units counts the slots freed in both).
func (c *Client) Release(ctx context.Context, key, token string) (Refunded, error) {
	full, err := c.fullKey(key)
	if err != nil {
		return Refunded{}, err
	}
	if err := checkToken(token); err != nil {
		return Refunded{}, err
	}
	r, err := c.report(ctx, opRelease, full, token, true)
	if err == nil && !r.Degraded && c.memory != nil {
		// Redis answered: a lease memory granted meanwhile is held there, not in Redis.
		r.Units += nonNeg(c.memory.release(full, token)[0])
	}
	return r, err
}

// report runs a one-key call that reports without deciding (refund, release). When Redis
// does not answer, FailLocal's memory answers if inMemory, else the policy (a refund or
// release of what Redis took is then lost: it only under-admits).
func (c *Client) report(ctx context.Context, o op, full, arg string, inMemory bool) (Refunded, error) {
	if err := ctx.Err(); err != nil {
		return Refunded{}, err
	}
	var cause error
	if !c.health.skip() {
		v, _, err := c.guarded(ctx, o, []string{full}, []any{arg})
		if err == nil {
			c.health.success()
			r, err := ints(v, 3)
			if err != nil {
				return Refunded{}, err
			}
			return Refunded{Units: nonNeg(r[0]), Remaining: nonNeg(r[1]), ResetAfter: msDuration(r[2])}, nil
		}
		if !errors.Is(err, errDown) {
			return Refunded{}, err
		}
		cause = errors.Unwrap(err)
	}
	if c.memory != nil && inMemory {
		// FailLocal: given back in memory (to what the local policy charged).
		var r [3]int64
		if o == opRefund {
			n, _ := strconv.ParseUint(arg, 10, 64)
			r = c.memory.refund(full, n)
		} else {
			r = c.memory.release(full, arg)
		}
		return Refunded{Units: nonNeg(r[0]), Remaining: nonNeg(r[1]), ResetAfter: msDuration(r[2]), Degraded: true}, nil
	}
	if _, err := c.health.answer(nil, full, cause); err != nil {
		return Refunded{}, err
	}
	return Refunded{Degraded: true}, nil
}

func nonNeg(v int64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

func msDuration(v int64) time.Duration {
	if v <= 0 {
		return 0
	}
	if v > int64(1<<63-1)/int64(time.Millisecond) {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(v) * time.Millisecond
}

// -- internals ----------------------------------------------------------------------------

func (c *Client) fullKey(key string) (string, error) {
	if key == "" {
		return "", usage("key must be a non-empty string")
	}
	return c.prefix + key, nil
}

func (c *Client) degraded(limit Spec, full string, cause error) (Decision, error) {
	d, err := c.health.answer(limit, full, cause)
	if err != nil {
		return Decision{}, err
	}
	c.counters.countDecision(d)
	return d, nil
}

func (c *Client) degradedAll(entries []Entry, keys []string, cause error, o checkOptions, count bool) (Decision, error) {
	if c.memory != nil {
		return c.localAll(entries, keys, o, count)
	}
	d, err := c.health.answer(nil, "", cause)
	if err != nil {
		return Decision{}, err
	}
	d.PerKey = make([]Decision, len(entries))
	for i, e := range entries {
		p, _ := c.health.answer(e.limit, keys[i], cause)
		d.PerKey[i] = p
		if p.Limit > 0 && (d.Limit == 0 || p.Limit < d.Limit) {
			d.Limit, d.Spec = p.Limit, e.limit
		}
	}
	if count {
		c.counters.countDecision(d)
	}
	return d, nil
}

// localSpec is limit as FailLocal enforces it: divided by the fleet size (rounding down, at
// least 1), its name kept.
func (c *Client) localSpec(limit Spec) (Spec, spec, error) {
	s, err := limit.spec()
	if err != nil || c.fleet <= 1 {
		return limit, s, err
	}
	div := func(n uint64) uint64 { return max(1, n/c.fleet) }
	var out Spec
	switch s.kind {
	case kindGCRA:
		g, err := NewGCRA(div(s.capacity), div(s.rate), time.Duration(s.span))
		if err == nil && s.name != "" {
			g, err = g.Named(s.name)
		}
		out = g
		if err != nil {
			return nil, spec{}, err
		}
	case kindLease:
		l, err := NewLease(div(s.capacity), time.Duration(s.span))
		if err == nil && s.name != "" {
			l, err = l.Named(s.name)
		}
		out = l
		if err != nil {
			return nil, spec{}, err
		}
	default:
		w, err := NewWindow(div(s.capacity), time.Duration(s.span), s.alg)
		if err == nil && s.name != "" {
			w, err = w.Named(s.name)
		}
		out = w
		if err != nil {
			return nil, spec{}, err
		}
	}
	ls, err := out.spec()
	return out, ls, err
}

// local is a decision of FailLocal's in-memory limits: Degraded, not Blind, Source local.
func local(r [5]int64, s Spec, key string, reservation bool) Decision {
	d := fromReply(r, s, key, SourceLocal, reservation)
	d.Degraded = true
	return d
}

func (c *Client) decidedLocally(d Decision) Decision {
	c.counters.add(cLocal, 1)
	c.counters.countDecision(d)
	return d
}

// degradedCheck is the failure policy's answer to a check Redis did not answer: the
// in-memory limits under FailLocal, else open / closed (or the error of FailError).
func (c *Client) degradedCheck(limit Spec, full string, cause error, o checkOptions) (Decision, error) {
	if c.memory == nil {
		return c.degraded(limit, full, cause)
	}
	ls, s, err := c.localSpec(limit)
	if err != nil {
		return Decision{}, err
	}
	wait := int64(-1)
	if o.hasWait {
		wait = o.maxWait.Milliseconds()
	}
	r, err := c.memory.check(full, s, o.cost, o.peek, o.force, wait)
	if err != nil {
		return Decision{}, err
	}
	return c.decidedLocally(local(r, ls, full, o.hasWait)), nil
}

// localAll is RL.ALL in memory (FailLocal).
func (c *Client) localAll(entries []Entry, keys []string, o checkOptions, count bool) (Decision, error) {
	items := make([]memoryItem, len(entries))
	specs := make([]Spec, len(entries))
	for i, e := range entries {
		ls, s, err := c.localSpec(e.limit)
		if err != nil {
			return Decision{}, err
		}
		items[i] = memoryItem{key: keys[i], s: s, cost: e.cost, hasCost: e.hasCost, token: e.token}
		specs[i] = ls
	}
	combined, each, err := c.memory.checkAll(items, o.cost, o.peek, o.force)
	if err != nil {
		return Decision{}, err
	}
	d := local(combined, nil, "", false)
	d.PerKey = make([]Decision, len(entries))
	for i, r := range each {
		d.PerKey[i] = local(r, specs[i], keys[i], false)
	}
	d.Spec = binding(d)
	if count {
		c.decidedLocally(d)
	}
	return d, nil
}

// degradedLease is the failure policy's answer to an Acquire Redis did not answer.
func (c *Client) degradedLease(lease Lease, full string, cause error, token string, slots uint64) (Decision, error) {
	if c.memory == nil {
		return c.degraded(lease, full, cause)
	}
	ls, s, err := c.localSpec(lease)
	if err != nil {
		return Decision{}, err
	}
	r, err := c.memory.lease(full, s, token, slots, false, false)
	if err != nil {
		return Decision{}, err
	}
	return c.decidedLocally(local(r, ls, full, false)), nil
}

func (c *Client) decided(d Decision) Decision {
	c.health.success()
	c.counters.countDecision(d)
	return d
}

// errDown wraps an outage that guarded turned into a policy answer.
var errDown = errors.New("redis-rl: outage")

type downError struct{ cause error }

func (e *downError) Error() string        { return "redis-rl: outage: " + e.cause.Error() }
func (e *downError) Unwrap() error        { return e.cause }
func (e *downError) Is(target error) bool { return target == errDown }

// guarded is call with outages counted and returned as a *downError (errors.Is errDown);
// errors.Unwrap gives the cause.
func (c *Client) guarded(ctx context.Context, o op, keys []string, args []any) (any, Mode, error) {
	v, mode, err := c.call(ctx, o, keys, args)
	if err != nil && ctx.Err() == nil && isUnavailable(err) {
		c.health.failure(&c.counters, err)
		return nil, mode, &downError{err}
	}
	return v, mode, err
}

// raw runs one command with the client's timeout, honouring ctx. pos is the first key's
// position (0: none) for Cluster routing. When ctx ends first its error is returned; when
// the client's own timeout runs out, errTimedOut (an outage).
func (c *Client) raw(ctx context.Context, args []any, pos int) (any, error) {
	return c.rawOn(ctx, c.rdb, args, pos)
}

// processor is what rawOn sends through: the client's go-redis client, or one node of a
// Cluster (*redis.Client).
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// rawOn is raw through p (one node of a Cluster, for what each master is asked).
func (c *Client) rawOn(ctx context.Context, p processor, args []any, pos int) (any, error) {
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := redis.NewCmd(tctx, args...)
	if pos > 0 {
		cmd.SetFirstKeyPos(int8(pos))
	}
	if c.ctxDeadline {
		_ = p.Process(tctx, cmd)
	} else {
		// go-redis reads with its own ReadTimeout unless ContextTimeoutEnabled is set: wait
		// on the context here, so a paused server costs no more than the timeout.
		done := make(chan struct{})
		go func() {
			_ = p.Process(tctx, cmd)
			close(done)
		}()
		select {
		case <-done:
		case <-tctx.Done():
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, errTimedOut
		}
	}
	v, err := cmd.Result()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if tctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || isUnavailable(err)) && serverError(err) == "" {
			return nil, fmt.Errorf("%w: %v", errTimedOut, err)
		}
		return nil, err
	}
	return v, nil
}

func (c *Client) mode(ctx context.Context) (Mode, error) {
	m := c.modeSetting
	if m == ModeAuto {
		switch c.resolved.Load() {
		case 1:
			m = ModeModule
		case 2:
			m = ModeFallback
		default:
			var err error
			if m, err = c.detect(ctx); err != nil {
				return ModeAuto, err
			}
		}
	}
	if m == ModeFallback && !c.libraryReady.Load() {
		c.detectMu.Lock()
		defer c.detectMu.Unlock()
		if !c.libraryReady.Load() {
			if err := c.ensureLibrary(ctx); err != nil {
				return ModeFallback, err
			}
			c.libraryReady.Store(true)
		}
	}
	return m, nil
}

// detect asks the server whether the module is loaded (COMMAND INFO RL.GCRA).
func (c *Client) detect(ctx context.Context) (Mode, error) {
	c.detectMu.Lock()
	defer c.detectMu.Unlock()
	switch c.resolved.Load() {
	case 1:
		return ModeModule, nil
	case 2:
		return ModeFallback, nil
	}
	reply, err := c.raw(ctx, []any{"COMMAND", "INFO", "RL.GCRA"}, 0)
	m := ModeModule
	switch {
	case err == nil && !commandExists(reply):
		m = ModeFallback
	case err == nil:
	case errorCode(err) == "NOPERM":
		// An ACL that admits the limiter's commands but not COMMAND: try the module; an
		// unknown command moves to the fallback.
	default:
		return ModeAuto, err
	}
	if m == ModeModule {
		c.resolved.Store(1)
	} else {
		c.resolved.Store(2)
	}
	return m, nil
}

// masters are the servers a library plan is made for: every master of a Cluster (its slots
// read again, so a master added since the last look is among them), sorted by address, or
// the one server (a nil node: the client itself).
func (c *Client) masters(ctx context.Context) ([]*redis.Client, error) {
	if c.cluster == nil {
		return []*redis.Client{nil}, nil
	}
	var mu sync.Mutex
	var out []*redis.Client
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	err := c.cluster.ForEachMaster(tctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		out = append(out, node)
		mu.Unlock()
		return nil
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Options().Addr < out[j].Options().Addr })
	return out, nil
}

// onNode runs a keyless command on node (nil: the one server) within the client's timeout.
func (c *Client) onNode(ctx context.Context, node *redis.Client, args ...any) (any, error) {
	if node == nil {
		return c.raw(ctx, args, 0)
	}
	return c.rawOn(ctx, node, args, 0)
}

func where(node *redis.Client) string {
	if node == nil {
		return ""
	}
	return " on " + node.Options().Addr
}

// ensureLibrary makes every master run our library version or a newer one, each by its own
// plan (docs/clients.md#the-fallback-where-users-are): asked FCALL_RO rl_version 0, a
// master without the library gets it (loadOn), one with an older library has it replaced
// (its operator's settings kept), one with a newer library (a rolling deploy) keeps it.
// Where FCALL is refused (Redis 6.x, an ACL, a service that disables Functions), or the
// library is missing and FUNCTION is refused, the fallback runs as a script.
func (c *Client) ensureLibrary(ctx context.Context) error {
	nodes, err := c.masters(ctx)
	if err != nil {
		return err
	}
	ours := libraryVersion(LuaLibrary)
	for _, node := range nodes {
		theirs, loaded, err := c.libraryOn(ctx, node)
		if err != nil {
			if isRefused(err) {
				c.useScripts(err)
				return nil
			}
			return err
		}
		scripts, err := c.loadOn(ctx, node, ours, theirs, loaded)
		if err != nil || scripts {
			return err
		}
	}
	return nil
}

// libraryOn asks node which library version it runs (FCALL_RO rl_version 0); loaded is
// false when it has none. A library so old it has no rl_version counts as missing here,
// and as version "" (older than any) once FUNCTION LOAD says it exists.
func (c *Client) libraryOn(ctx context.Context, node *redis.Client) (version string, loaded bool, err error) {
	v, err := c.onNode(ctx, node, "FCALL_RO", "rl_version", "0")
	if err != nil {
		if isMissingFunction(err) {
			return "", false, nil
		}
		return "", false, err
	}
	version, _ = v.(string)
	return version, true, nil
}

// loadOn loads our library on node as planFor says for the version there. A missing
// library is loaded without REPLACE, so one another client loaded since we looked (maybe a
// newer one) is never overwritten: it is looked at again, and replaced only if it is older.
// scripts is true when the fallback moved to scripts (FUNCTION refused, no library there).
func (c *Client) loadOn(ctx context.Context, node *redis.Client, ours, theirs string, loaded bool) (scripts bool, err error) {
	at := where(node)
	log := c.health.logger
	for range 2 {
		plan := planFor(theirs, loaded, ours)
		switch plan {
		case planKeep:
			return false, nil
		case planNewer:
			// A newer client loaded it (a rolling deploy): it answers our calls too.
			log.Warn("redis-rl: the server"+at+" runs a newer redis_rl library than this client's: left in place",
				slog.String("theirs", theirs), slog.String("ours", ours))
			return false, nil
		}
		if !c.loadLibrary {
			if plan == planLoad {
				return false, &libraryError{"the redis_rl Functions library is not loaded" + at + " and loading it is not allowed (WithLoadLibrary(false))"}
			}
			log.Warn("redis-rl: the server"+at+" runs an older redis_rl library than this client's; WithLoadLibrary(false): not replaced",
				slog.String("theirs", theirs), slog.String("ours", ours))
			return false, nil
		}
		load := []any{"FUNCTION", "LOAD", LuaLibrary}
		if plan == planReplace {
			load = []any{"FUNCTION", "LOAD", "REPLACE", c.configuredFor(ctx, node)}
		}
		_, err := c.onNode(ctx, node, load...)
		switch {
		case err == nil:
			had := theirs
			if !loaded {
				had = "none"
			}
			log.Info("redis-rl: loaded the redis_rl library"+at, slog.String("ours", ours), slog.String("had", had))
			return false, nil
		case plan == planLoad && strings.Contains(strings.ToLower(serverError(err)), "already exists"):
			// Another client loaded it since we looked: "" (no rl_version) is older.
			v, err := c.onNode(ctx, node, "FCALL_RO", "rl_version", "0")
			if err != nil && !isMissingFunction(err) {
				return false, err
			}
			theirs, loaded = "", true
			if err == nil {
				theirs, _ = v.(string)
			}
		case isRefused(err):
			if loaded {
				// FUNCTION denied: the library there will do.
				log.Warn("redis-rl: cannot load the redis_rl library"+at+"; using the one there",
					slog.String("theirs", theirs), slog.String("ours", ours), slog.String("error", err.Error()))
				return false, nil
			}
			c.useScripts(err)
			return true, nil
		default:
			return false, err
		}
	}
	return false, nil
}

// configuredFor is our library's code with the settings of the library on node kept (an
// operator's edited lines), read with FUNCTION LIST ... WITHCODE; ours as it is if that
// fails.
func (c *Client) configuredFor(ctx context.Context, node *redis.Client) string {
	v, err := c.onNode(ctx, node, "FUNCTION", "LIST", "LIBRARYNAME", LibraryName, "WITHCODE")
	if err != nil {
		return LuaLibrary
	}
	if _, code, loaded := listedLibrary(v); loaded {
		return configuredCode(LuaLibrary, code)
	}
	return LuaLibrary
}

// useScripts switches the fallback to scripts: EVAL first, EVALSHA once a server has the
// text.
func (c *Client) useScripts(why error) {
	if !c.scripts.Swap(true) {
		c.health.logger.Info("redis-rl: no Functions library on this server: the Lua fallback runs as a script (EVAL, then EVALSHA)",
			slog.String("why", why.Error()))
	}
}

// scriptForm is how the fallback is sent now: FCALL, or as a script (see Client.scripts).
func (c *Client) scriptForm() scriptCall {
	switch {
	case !c.scripts.Load():
		return viaFunctions
	case c.evalRefused.Load():
		return viaSHA
	case c.evalshaRefused.Load() || !c.scriptCached.Load():
		return viaText
	}
	return viaSHA
}

// scriptStep is how a call sent as a script goes on after an error.
type scriptStep uint8

const (
	stepNone  scriptStep = iota // not a scripting problem, or nothing left to try
	stepRetry                   // send the call again, in the (updated) form
	stepLoad                    // SCRIPT LOAD the text on the key's node, then EVALSHA
)

// scriptRecovery decides how a call sent as a script (form sent) goes on after err, and
// records what the server refuses: NOSCRIPT (a node without the text: a restart, a
// failover, a node added to a Cluster) sends the text there (EVAL, or SCRIPT LOAD where
// EVAL is refused); a refused EVAL moves to SCRIPT LOAD + EVALSHA, a refused EVALSHA to
// EVAL (docs/clients.md#the-fallback-where-users-are). A refusal another call recorded
// first sends this one again in the form that is left.
func (c *Client) scriptRecovery(sent scriptCall, err error) scriptStep {
	if sent == viaSHA && isNoScript(err) {
		if c.evalRefused.Load() {
			return stepLoad
		}
		c.scriptCached.Store(false)
		return stepRetry
	}
	if !isRefused(err) {
		return stepNone
	}
	switch sent {
	case viaText:
		first := !c.evalRefused.Swap(true)
		switch {
		case c.evalshaRefused.Load():
			return stepNone
		case first:
			return stepLoad
		}
		return stepRetry
	case viaSHA:
		c.evalshaRefused.Store(true)
		if c.evalRefused.Load() {
			return stepNone
		}
		return stepRetry
	}
	return stepNone
}

// noScripting is the one clear error of a server with neither the module nor any way to
// run the fallback.
func noScripting(err error) error {
	return &libraryError{fmt.Sprintf("cannot decide on this server: it has no redis-rl module (RL.GCRA is not there) "+
		"and refuses the Lua fallback both as a Functions library (FUNCTION/FCALL) and as scripts (EVAL/EVALSHA): %v. "+
		"Load the module, or allow FCALL and FUNCTION, or EVAL and EVALSHA, for this client", err)}
}

// masterFor is where a call on keys goes when it must reach the master that holds them: on a
// Cluster the master of the first key's slot (asked within the client's timeout), else the
// one client.
func (c *Client) masterFor(ctx context.Context, keys []string) (processor, error) {
	if c.cluster == nil || len(keys) == 0 {
		return c.rdb, nil
	}
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.cluster.MasterForKey(tctx, keys[0])
}

// scriptLoad sends the script's text with SCRIPT LOAD to the master of the first key's
// slot (the one server), where EVAL is refused.
func (c *Client) scriptLoad(ctx context.Context, keys []string) error {
	p, err := c.masterFor(ctx, keys)
	if err != nil {
		return err
	}
	if _, err := c.rawOn(ctx, p, []any{"SCRIPT", "LOAD", scriptText()}, 0); err != nil {
		if isRefused(err) {
			return noScripting(err)
		}
		return err
	}
	return nil
}

// twin asks the library's no-writes twin of o (FCALL_RO rl_<op>_ro, the same keys and
// arguments, the same node: on a Cluster the master of the first key's slot, never a
// replica, whatever the ClusterClient's ReadOnly routing) once, after the server refused FCALL rl_<op> out of memory
// (docs/clients.md#out-of-memory): its answer (a denial, a peek, an error, or OOM where the
// call would write) is the call's. Without a twin (refunds and releases, a library older
// than 1.3.0, FCALL_RO refused) the first OOM error stands.
func (c *Client) twin(ctx context.Context, o op, keys []string, args []any, oom error) (any, error) {
	name, ok := o.twin()
	if !ok {
		return nil, oom
	}
	// FCALL_RO is a read-only command: a ClusterClient with ReadOnly (RouteByLatency,
	// RouteRandomly) would send it to a replica, which has not the master's writes of the
	// last instants and is not the server that refused the call. Ask the master of the
	// key's slot, as the FCALL was.
	p, err := c.masterFor(ctx, keys)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, oom
	}
	c.counters.add(cRedisCalls, 1)
	wire, pos := twinFrame(name, keys, args)
	v, err := c.rawOn(ctx, p, wire, pos)
	if err != nil {
		if ctx.Err() == nil && (isMissingFunction(err) || isRefused(err) || isRedirect(err)) {
			// No twin there; or the slot moved since the FCALL (MOVED, ASK): the node that
			// refused it is not asked again, and its OOM stands.
			return nil, oom
		}
		return nil, err
	}
	return v, nil
}

// isRedirect is a Cluster's MOVED or ASK reply (from one node's client, which does not
// follow it).
func isRedirect(err error) bool {
	switch errorCode(err) {
	case "MOVED", "ASK":
		return true
	}
	return false
}

// call runs one command in the resolved mode, detecting again once when the module
// disappeared or the library was flushed (a restart, a failover, a master added to a
// Cluster), retrying once a connection-level failure (docs/clients.md#recovery), asking the
// no-writes twin once when the library's writing function is refused out of memory, and, as
// a script, going on as scriptRecovery says.
func (c *Client) call(ctx context.Context, o op, keys []string, args []any) (any, Mode, error) {
	reconnected, redetected := false, false
	for range 5 {
		mode, err := c.mode(ctx)
		form := viaFunctions
		if err == nil {
			c.counters.add(cRedisCalls, 1)
			var wire []any
			var pos int
			if mode == ModeFallback {
				form = c.scriptForm()
			}
			wire, pos = frame(mode, form, scriptSHA(), o, keys, args)
			var v any
			if v, err = c.raw(ctx, wire, pos); err == nil {
				if form == viaText {
					c.scriptCached.Store(true) // the server has the text now
				}
				return v, mode, nil
			}
			if mode == ModeFallback && form == viaFunctions && isOOM(err) {
				v, err = c.twin(ctx, o, keys, args, err)
				return v, mode, err
			}
		} else if errors.Is(err, ErrLibrary) {
			return nil, mode, err
		}
		if ctx.Err() != nil {
			return nil, mode, ctx.Err()
		}
		if !reconnected && isConnectionLevel(err) {
			reconnected = true
			continue
		}
		if !redetected && mode == ModeModule && c.modeSetting == ModeAuto && isUnknownCommand(err) {
			// The module is not (or no longer) there: the fallback answers.
			redetected = true
			c.resolved.Store(2)
			continue
		}
		if mode == ModeFallback && form != viaFunctions {
			switch c.scriptRecovery(form, err) {
			case stepRetry:
				continue
			case stepLoad:
				if err := c.scriptLoad(ctx, keys); err != nil {
					return nil, mode, err
				}
				continue
			}
			if isRefused(err) {
				return nil, mode, noScripting(err)
			}
		}
		if !redetected && mode == ModeFallback && form == viaFunctions && isMissingFunction(err) {
			redetected = true
			c.libraryReady.Store(false)
			continue
		}
		return nil, mode, err
	}
	return nil, ModeFallback, &libraryError{fmt.Sprintf("the fallback kept failing on this server (%s)", o.function())}
}
