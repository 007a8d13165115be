-- The platform's lock on a business unit (cosmos-paper §9.1, §10.2: BU policies stay within the
-- platform's locks): the highest per-person daily cap, in USD, that the unit's administrators may
-- set on a policy of one of the unit's people. NULL: no lock was given, and a unit administrator
-- may not raise a cap above what it is now (a policy's cap, or the $20 default without one).
ALTER TABLE business_units ADD COLUMN daily_cap_lock_usd numeric(20, 9)
    CHECK (daily_cap_lock_usd IS NULL OR daily_cap_lock_usd >= 0);
