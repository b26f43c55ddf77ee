-- hit.lua: ankusa-fleet's hit (docs/contract.md §4 and §5) for one charge and one claim, as one
-- atomic Redis script. Used by scripts/compare-redis.sh to compare against the fleet.
--
-- EVALSHA <sha> 2 <bucket_key> <claim_key> <increment_us> <capacity_us> <hook_id> <pending_ttl_ms>
--
-- Replies: {"allowed"} | {"rate_limited", retry_after_ms} | {"duplicate", holder_hook_id}
--        | {"pending", retry_after_ms}
--
-- State, kept small:
--   bucket_key -> TAT (integer microseconds since the Unix epoch), expiring at the TAT
--                 (SET ... PXAT, i.e. PEXPIREAT): a TAT not after now is the same as no bucket.
--   claim_key  -> hash {h = hook_id, s = "p"|"c", e = expires_at_us}, with PEXPIRE.
-- Time is the server clock (TIME), read once per call, like the leader stamp on a log entry.
-- Numbers are Lua doubles: exact for integers below 2^53 (epoch microseconds are ~1.8e15).

local function int(x) return string.format('%d', x) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local increment = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local hook = ARGV[3]
local pending_ttl_ms = tonumber(ARGV[4])
if not increment or not capacity or increment < 1 or capacity < increment then
  return redis.error_reply('INVALID_ARGUMENT charges: increment_us >= 1 and capacity_us >= increment_us')
end
if not hook or hook == '' or not pending_ttl_ms or pending_ttl_ms < 1 then
  return redis.error_reply('INVALID_ARGUMENT claim: hook_id and pending_ttl_ms')
end

-- 2. Charges first: a denied charge answers rate_limited and writes nothing at all.
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
local new_tat = tat + increment
if new_tat - now > capacity then
  local retry = math.ceil((new_tat - now - capacity) / 1000)
  if retry < 1 then retry = 1 end
  return {'rate_limited', retry}
end

-- 3. The claim.
local claim = redis.call('HMGET', KEYS[2], 'h', 's', 'e')
if claim[1] then
  local expires = tonumber(claim[3]) or 0
  if expires > now then
    if claim[2] == 'c' then
      return {'duplicate', claim[1]}
    end
    if claim[1] ~= hook then
      local left = math.ceil((expires - now) / 1000)
      if left < 1 then left = 1 end
      return {'pending', left}
    end
    -- Pending for this very hook (a retry): allowed, nothing charged, expiry not extended.
    return {'allowed'}
  end
end

-- 4. Take: apply the charge, hold the claim pending.
redis.call('HSET', KEYS[2], 'h', hook, 's', 'p', 'e', int(now + pending_ttl_ms * 1000))
redis.call('PEXPIRE', KEYS[2], pending_ttl_ms)
redis.call('SET', KEYS[1], int(new_tat), 'PXAT', int(math.ceil(new_tat / 1000)))
return {'allowed'}
