//! The Lua scripts behind every store operation. Each runs atomically on the server, so every
//! operation is one round trip (EVALSHA, or EVAL the first time a server sees the script).
//!
//! A lease key holds `"<token> <holder>"` (holder ids contain no whitespace) with a `PX` expiry;
//! its fencing counter is a plain integer key, never below the server's clock (ms × 1000), that
//! expires a retention after it was last moved up to the clock. Tokens travel as decimal strings: Lua numbers are doubles, so the
//! scripts never turn a token received from the client into a number.
//!
//! The hot paths (acquire of a free lease, renew, release) are kept to the commands they need:
//! the client sends the `"<token> <holder>"` value to compare with and the error helpers are one
//! closure.

use std::sync::LazyLock;

/// A script and its SHA1, for EVALSHA.
pub(crate) struct LuaScript {
    pub(crate) code: String,
    pub(crate) hash: String,
}

impl LuaScript {
    pub(crate) fn new(body: &str) -> Self {
        let code = format!("{PRELUDE}\n{body}");
        let hash = redis::Script::new(&code).get_hash().to_owned();
        Self { code, hash }
    }
}

/// The error replies, in one closure (each closure a script defines costs on every call). A key
/// of another type is only looked at when a command on it fails, so the common path pays for no
/// `TYPE` call: `fail(k)` then names the key and what it holds; `fail(k, what)` reports a
/// leasehold key whose content is not what leasehold writes.
const PRELUDE: &str = r#"
local function fail(k, what)
  if what then return redis.error_reply('LEASEHOLD_CORRUPT key ' .. k .. ' ' .. what) end
  return redis.error_reply('WRONGTYPE key ' .. k .. ' holds a ' .. redis.call('TYPE', k)['ok'] .. ', not a leasehold value')
end
"#;

/// `take(t)`: takes the lease KEYS[1] for ARGV[1] (ttl ARGV[2] ms) with a new token from the
/// fencing counter KEYS[2] (kept ARGV[3] ms after it last moved up to the clock). Returns the
/// token (a decimal string), or `false, holder, pttl` while another holder's tenure is live
/// (nothing written), or an error reply; `t` is the server's `TIME` if the caller read it.
/// Every acquisition, the holder's own re-acquire included, is a new tenure: the counter goes
/// up and the lease key is overwritten.
///
/// The token is the counter plus one, or the server's clock (ms × 1000) plus one if that is
/// higher. Tokens then only go up even where the server loses writes: a restart without
/// persistence, or a failover to a replica that had not received the last acquisition (its
/// counter one behind would otherwise hand the same token out again, and fencing could not tell
/// the two tenures apart). The counter's expiry is set whenever it is moved up to the clock, so
/// it lives a retention after the name's last acquisition (at most a thousand per millisecond
/// move it without the clock).
const TAKE_FN: &str = r#"
local function take(t)
  local cur = redis.pcall('GET', KEYS[1])
  if cur then
    if type(cur) == 'table' then return fail(KEYS[1]) end
    local sp = string.find(cur, ' ', 1, true)
    if not sp or sp == 1 or sp == #cur then return fail(KEYS[1], 'is not a leasehold lease') end
    local who = string.sub(cur, sp + 1)
    -- Busy only while another holder's tenure is live. The holder itself gets a new tenure
    -- below: a new token, replacing its older tenure (whose renew and release then fail).
    if who ~= ARGV[1] then return false, who, redis.call('PTTL', KEYS[1]) end
  end
  local n = redis.pcall('INCR', KEYS[2])
  local tok
  if type(n) ~= 'number' then
    if string.sub(n.err, 1, 9) == 'WRONGTYPE' then return fail(KEYS[2]) end
    return fail(KEYS[2], 'is not a fencing counter')
  elseif n < 9007199254740992 then
    -- A token is never below the server's clock in milliseconds x 1000: a counter that is
    -- missing (first use, expired after its retention, data lost) or set back (a failover to a
    -- replica that missed its last increments) still hands out tokens above every earlier one.
    t = t or redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + math.floor(tonumber(t[2]) / 1000) * 1000
    local moved = n <= now
    if moved then n = now + 1 end
    -- Exact as a Lua number (a double) below 2^53. Two %d halves below 2^31 each: exact
    -- whatever the width of the C long Lua formats them with, and cheaper than '%.0f'.
    local hi = math.floor(n / 1000000000)
    tok = string.format('%d%09d', hi, n - hi * 1000000000)
    if moved then redis.call('SET', KEYS[2], tok, 'PX', ARGV[3]) end
  else
    tok = redis.call('GET', KEYS[2])
  end
  redis.call('SET', KEYS[1], tok .. ' ' .. ARGV[1], 'PX', ARGV[2])
  return tok
end
"#;

fn lease_script(body: &str) -> LuaScript {
    LuaScript::new(&format!("{TAKE_FN}{body}"))
}

/// KEYS: lease, fence. ARGV: holder, ttl ms, counter retention ms (at least the ttl).
/// Returns the token (see `TAKE_FN`), or `{0, holder, pttl}`. A grant answers a plain string:
/// converting a Lua table into a reply costs the server more than the rest of the script's own
/// work (a third of a no-op script's instructions, callgrind on Redis 7.0).
pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    lease_script(
        r#"
-- Redis < 5 replicates scripts verbatim unless told otherwise, which forbids TIME after a write.
if redis.replicate_commands then redis.replicate_commands() end
local tok, who, pttl = take()
if not tok then return {0, who, pttl} end
return tok
"#,
    )
});

/// KEYS: lease. ARGV: `"<token> <holder>"`, ttl ms. Returns 1 (renewed) or 0 (lost).
pub(crate) static RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if type(cur) == 'table' then return fail(KEYS[1]) end
return 0
"#,
    )
});

/// KEYS: lease. ARGV: `"<token> <holder>"`, channel, name. Returns 1 (released, announced) or 0.
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
if type(cur) == 'table' then return fail(KEYS[1]) end
return 0
"#,
    )
});

/// KEYS: lease, fence. Returns nil (never acquired), `{0, token}` (free) or
/// `{1, token, holder, pttl}` (held).
pub(crate) static INSPECT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return fail(KEYS[1]) end
if cur then
  local sp = string.find(cur, ' ', 1, true)
  if not sp or sp == 1 or sp == #cur then return fail(KEYS[1], 'is not a leasehold lease') end
  return {1, string.sub(cur, 1, sp - 1), string.sub(cur, sp + 1), redis.call('PTTL', KEYS[1])}
end
local fence = redis.pcall('GET', KEYS[2])
if type(fence) == 'table' then return fail(KEYS[2]) end
if fence then return {0, fence} end
return false
"#,
    )
});

/// KEYS: slot. ARGV: slot. Returns `{1}` (claimed) or `{0, last}`. Slots are compared as
/// decimal strings (length, then digits) so u64 values keep their precision.
pub(crate) static CLAIM_SLOT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local last = redis.pcall('GET', KEYS[1])
if type(last) == 'table' then return fail(KEYS[1]) end
if last then
  if not string.match(last, '^%d+$') then return fail(KEYS[1], 'is not a slot number') end
  if #last > #ARGV[1] or (#last == #ARGV[1] and last >= ARGV[1]) then
    return {0, last}
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return {1}
"#,
    )
});

/// KEYS: lease, fence, slot, task (the catalog's record). ARGV: holder, ttl ms, counter retention
/// ms, slot, next slot (`''`: none). A gated tick in one script: the server's clock (is it in
/// `[slot, next)`?), the control record (paused?), the slot record (already run?), the lease
/// (busy?), and only then the lease (`take`) and the forward-only claim. Replies
/// `{code, clock ms, control version, control, ...}`: 1 claimed (+ token), 2 outside the slot
/// (nothing more), 3 paused, 4 already run (+ last slot), 5 busy (+ last slot or nil, holder,
/// pttl). Nothing is written unless the lease and the claim both are.
pub(crate) static TICK: LazyLock<LuaScript> = LazyLock::new(|| {
    lease_script(
        r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if clock < tonumber(ARGV[4]) or (ARGV[5] ~= '' and clock >= tonumber(ARGV[5])) then
  return {2, clock}
end
local control = redis.pcall('HMGET', KEYS[4], 'version', 'control')
if control.err then return fail(KEYS[4]) end
local version, record = control[1], control[2]
if record then
  local ok, c = pcall(cjson.decode, record)
  if not ok or type(c) ~= 'table' or (c.paused ~= nil and c.paused ~= cjson.null) then
    return {3, clock, version, record}
  end
end
local last = redis.pcall('GET', KEYS[3])
if type(last) == 'table' then return fail(KEYS[3]) end
if last then
  if not string.match(last, '^%d+$') then return fail(KEYS[3], 'is not a slot number') end
  if #last > #ARGV[4] or (#last == #ARGV[4] and last >= ARGV[4]) then
    local cur = redis.pcall('GET', KEYS[1])
    if type(cur) == 'table' then return fail(KEYS[1]) end
    local sp = cur and string.find(cur, ' ', 1, true)
    if cur and (not sp or sp == 1 or sp == #cur) then return fail(KEYS[1], 'is not a leasehold lease') end
    local who = cur and string.sub(cur, sp + 1)
    if who and who ~= ARGV[1] then
      return {5, clock, version, record, last, who, redis.call('PTTL', KEYS[1])}
    end
    return {4, clock, version, record, last}
  end
end
local tok, who, pttl = take(t)
if not tok then return {5, clock, version, record, last, who, pttl} end
if type(tok) == 'table' then return tok end
redis.call('SET', KEYS[3], ARGV[4])
return {1, clock, version, record, tok}
"#,
    )
});

/// KEYS: slot. Returns the last claimed slot (a decimal string) or nil.
pub(crate) static LAST_SLOT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local last = redis.pcall('GET', KEYS[1])
if type(last) == 'table' then return fail(KEYS[1]) end
if last and not string.match(last, '^%d+$') then return fail(KEYS[1], 'is not a slot number') end
return last or false
"#,
    )
});

/// A run history is one sorted set whose members all have score 0 and read
/// `<key as 20 zero-padded decimal digits>:<entry>`. Members with equal scores sort by their
/// bytes, so rank order is key order over the whole u64 range (a score, a double, is exact only
/// up to 2^53), and the entries of one key are the members between `[<key>:` and `(<key>;`.
pub(crate) const HISTORY_KEY_DIGITS: usize = 20;

/// KEYS: history. ARGV: key (20 digits), entry, keep. Replaces the entry with that key, then
/// trims to the `keep` highest keys. Returns 1.
pub(crate) static RECORD_HISTORY: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local removed = redis.pcall('ZREMRANGEBYLEX', KEYS[1], '[' .. ARGV[1] .. ':', '(' .. ARGV[1] .. ';')
if type(removed) == 'table' then
  if string.sub(removed.err, 1, 9) == 'WRONGTYPE' then return fail(KEYS[1]) end
  return removed
end
redis.call('ZADD', KEYS[1], 0, ARGV[1] .. ':' .. ARGV[2])
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[3])
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1)
end
return 1
"#,
    )
});

/// KEYS: history. ARGV: last rank (limit - 1). Returns the members, highest key first.
pub(crate) static HISTORY: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local entries = redis.pcall('ZREVRANGE', KEYS[1], 0, ARGV[1])
if type(entries) == 'table' and entries.err then
  if string.sub(entries.err, 1, 9) == 'WRONGTYPE' then return fail(KEYS[1]) end
  return entries
end
return entries
"#,
    )
});

/// KEYS: members (a sorted set of holder ids scored by their expiry, ms on the server's clock).
/// ARGV: holder, ttl ms. Refreshes the holder's entry, drops the expired ones, keeps the key alive
/// for as long as its longest-lived entry, and returns the live holders.
pub(crate) static MEMBERS: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
-- Redis < 5 replicates scripts verbatim unless told otherwise, which forbids TIME before a write.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local added = redis.pcall('ZADD', KEYS[1], now + ttl, ARGV[1])
if type(added) == 'table' then return fail(KEYS[1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"#,
    )
});

/// KEYS: members. ARGV: holder. Removes the holder's entry. Returns 1.
pub(crate) static LEAVE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
if type(removed) == 'table' then return fail(KEYS[1]) end
return 1
"#,
    )
});

/// The server's clock in ms, as `now`. Scripts that write after reading it replicate their
/// effects (Redis < 5 replicates scripts verbatim unless told otherwise, which forbids TIME
/// before a write).
const CLOCK: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"#;

/// The catalog's index of task names (a sorted set scored by when the task's records lapse, ms
/// on the server's clock; `inf` once the task has a control record, which never lapses).
/// `index(k, name, keep)` keeps `name` at least `keep` ms from now (`'inf'`: for good) and drops
/// the entries that lapsed. Scores are written as `%.0f` text: every number the catalog writes is
/// an integer below 2^53 (ttls are capped), exact as a Lua number.
const INDEX_FN: &str = r#"
local function index(k, name, keep)
  local cur = redis.pcall('ZSCORE', k, name)
  if type(cur) == 'table' then return fail(k) end
  if cur ~= 'inf' then
    if keep == 'inf' then
      redis.call('ZADD', k, 'inf', name)
    else
      local score = now + tonumber(keep)
      if not cur or tonumber(cur) < score then
        redis.call('ZADD', k, string.format('%.0f', score), name)
      end
    end
  end
  redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%.0f', now))
end
"#;

fn catalog_script(body: &str) -> LuaScript {
    LuaScript::new(&format!("{CLOCK}{INDEX_FN}{body}"))
}

/// KEYS: task (a hash: `definition`, and `version` + `control` once a control record was
/// written), instances (a hash: instance → `"<expiry ms> <about>"`), and on a single server the
/// index. ARGV: definition, instance, about, ttl ms, forget ms, task name. Writes the definition
/// and the heartbeat, drops this task's instances expired for `forget` ms or more, keeps both
/// keys (and the index entry) for at least `ttl + forget` ms (the task hash for good once it has
/// a control record), and returns `{version, control}` or nil.
pub(crate) static REGISTER: LazyLock<LuaScript> = LazyLock::new(|| {
    catalog_script(
        r#"
local ttl, forget = tonumber(ARGV[4]), tonumber(ARGV[5])
-- Both keys are read and checked before anything is written.
local control = redis.pcall('HMGET', KEYS[1], 'version', 'control')
if control.err then return fail(KEYS[1]) end
local all = redis.pcall('HGETALL', KEYS[2])
if all.err then return fail(KEYS[2]) end
for i = 1, #all, 2 do
  if not string.match(all[i + 1], '^%d+ ') then
    return fail(KEYS[2], 'holds an entry that is not "<expiry> <about>"')
  end
end
for i = 1, #all, 2 do
  if tonumber(string.match(all[i + 1], '^%d+')) + forget <= now then
    redis.call('HDEL', KEYS[2], all[i])
  end
end
redis.call('HSET', KEYS[1], 'definition', ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], string.format('%.0f', now + ttl) .. ' ' .. ARGV[3])
local keep = ttl + forget
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], string.format('%.0f', keep)) end
if not control[1] and redis.call('PTTL', KEYS[1]) < keep then
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', keep))
end
if KEYS[3] then index(KEYS[3], ARGV[6], control[1] and 'inf' or keep) end
if control[1] then return control end
return false
"#,
    )
});

/// KEYS: index. ARGV: task name, ms to keep it listed for (or `inf`). The index half of
/// `register` and `set_control` on a Redis Cluster, where the index is on another node. Returns 1.
pub(crate) static INDEX_TASK: LazyLock<LuaScript> = LazyLock::new(|| {
    catalog_script(
        r#"
index(KEYS[1], ARGV[1], ARGV[2])
return 1
"#,
    )
});

/// KEYS: instances. ARGV: instance. Removes the instance's heartbeat. Returns 1.
pub(crate) static UNREGISTER: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local removed = redis.pcall('HDEL', KEYS[1], ARGV[1])
if type(removed) == 'table' then return fail(KEYS[1]) end
return 1
"#,
    )
});

/// KEYS: index. Drops the lapsed entries and returns the task names.
pub(crate) static LIST_TASKS: LazyLock<LuaScript> = LazyLock::new(|| {
    catalog_script(
        r#"
local lapsed = redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
if type(lapsed) == 'table' then return fail(KEYS[1]) end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"#,
    )
});

/// KEYS: task, instances. Returns `{now ms, {definition, version, control}, {instance, entry, …}}`.
pub(crate) static READ_TASK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(&format!(
        "{CLOCK}{}",
        r#"
local task = redis.pcall('HMGET', KEYS[1], 'definition', 'version', 'control')
if task.err then return fail(KEYS[1]) end
local instances = redis.pcall('HGETALL', KEYS[2])
if instances.err then return fail(KEYS[2]) end
return {now, task, instances}
"#
    ))
});

/// KEYS: task, instances, history, and on a single server the index. ARGV: `1` to delete the
/// history too, task name. Counts the instances whose heartbeat is live; with none, deletes the
/// task's hash and instances (the history when asked) and its index entry. Returns
/// `{live, keys deleted}`. One script: a registration runs wholly before it (and is seen live)
/// or after it (and writes the task afresh).
pub(crate) static FORGET: LazyLock<LuaScript> = LazyLock::new(|| {
    catalog_script(
        r#"
local all = redis.pcall('HGETALL', KEYS[2])
if all.err then return fail(KEYS[2]) end
local live = 0
for i = 1, #all, 2 do
  local expiry = string.match(all[i + 1], '^%d+')
  if not expiry then return fail(KEYS[2], 'holds an entry that is not "<expiry> <about>"') end
  if tonumber(expiry) > now then live = live + 1 end
end
if live > 0 then return {live, 0} end
local gone = redis.call('DEL', KEYS[1], KEYS[2])
if ARGV[1] == '1' then redis.call('DEL', KEYS[3]) end
if KEYS[4] then
  local removed = redis.pcall('ZREM', KEYS[4], ARGV[2])
  if type(removed) == 'table' then return fail(KEYS[4]) end
end
return {0, gone}
"#,
    )
});

/// KEYS: index. ARGV: task name. Removes the task's entry (the index half of `forget` on a
/// Redis Cluster). Returns 1.
pub(crate) static UNINDEX_TASK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
if type(removed) == 'table' then return fail(KEYS[1]) end
return 1
"#,
    )
});

/// KEYS: task. Returns `{now ms, version, control}` (nil for both without a control record).
pub(crate) static CONTROL: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(&format!(
        "{CLOCK}{}",
        r#"
local control = redis.pcall('HMGET', KEYS[1], 'version', 'control')
if control.err then return fail(KEYS[1]) end
return {now, control[1], control[2]}
"#
    ))
});

/// KEYS: task, and on a single server the index. ARGV: expected version (`''`: none yet),
/// value, task name. Writes the control record if its version is the expected one, keeps the
/// task's hash for good and lists the task for good. Returns the new version, or nil.
pub(crate) static SET_CONTROL: LazyLock<LuaScript> = LazyLock::new(|| {
    catalog_script(
        r#"
local current = redis.pcall('HGET', KEYS[1], 'version')
if type(current) == 'table' then return fail(KEYS[1]) end
if (current or '') ~= ARGV[1] then return false end
local version = redis.pcall('HINCRBY', KEYS[1], 'version', 1)
if type(version) == 'table' then return fail(KEYS[1], 'holds a control version that is not a number') end
redis.call('HSET', KEYS[1], 'control', ARGV[2])
redis.call('PERSIST', KEYS[1])
if KEYS[2] then index(KEYS[2], ARGV[3], 'inf') end
return version
"#,
    )
});
