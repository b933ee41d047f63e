-- idem, optional: row-level security by account. Each run-time role sees
-- and writes only the accounts it is mapped to in idem_account_roles; the
-- owner of idem_records (who migrates, and runs the `idem` command) and
-- superusers still see every row.
--
-- Why a role <-> account mapping rather than a session setting such as
-- `SET idem.account = ...`: any role may change its own settings, so a
-- setting only guards against honest mistakes, while a role cannot make
-- itself another role. The gate's account is chosen per call
-- (`gate.account(..)`), so give each tenant (or group of tenants) its own
-- login role and its own pool: `Gate::connect(pool_of_tenant_role)`, then
-- `.account(tenant)`. Connections of one pool all run as one role, so the
-- policy holds however the pool hands them out.
--
-- What a role then gets for another account's rows:
--   - SELECT, UPDATE, DELETE: they are invisible (0 rows). An operator
--     release or a prune run as a tenant role cannot touch other accounts.
--   - A claim (or a metered event) in an account it is not mapped to is
--     refused by the policy, which PostgreSQL applies to the new row before
--     it looks for a conflicting one: the gate refuses the claim, failing
--     closed, and the body does not run, whether or not that account holds
--     the slot. Today the gate reports it as Rejected::Unavailable, with
--     "new row violates row-level security policy" as its source.
--
-- Keep any policy of your own on account (or namespace): columns of the
-- unique key. A policy on another column (say, each role sees the rows it
-- created) can hide the very row an insert conflicts with; the gate then
-- finds the slot taken but no row in it, and refuses InFlight every time.
-- With this policy that cannot happen: a new row it lets through is in an
-- account whose rows the role sees, conflicting ones included.

-- Run it after the schema is set up, as the owner of idem_records:
--
--   psql -v ON_ERROR_STOP=1 -v idem_schema=public \
--        -f idem-runtime/sql/row_level_security.sql
--
-- then map roles to accounts (as the owner):
--
--   INSERT INTO public.idem_account_roles (role_name, account)
--   VALUES ('tenant_acme', 'acme');
--
-- Rerunning this file is harmless. Undo it with
--   ALTER TABLE idem_records DISABLE ROW LEVEL SECURITY;

-- Which role may use which account. `name`, as current_user is.
CREATE TABLE IF NOT EXISTS :"idem_schema".idem_account_roles (
    role_name name NOT NULL,
    account   text NOT NULL,
    PRIMARY KEY (role_name, account)
);

-- The policy below reads the mapping as the querying role, so every role
-- may read it, but only its own rows of it.
ALTER TABLE :"idem_schema".idem_account_roles ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS idem_account_roles_own ON :"idem_schema".idem_account_roles;
CREATE POLICY idem_account_roles_own ON :"idem_schema".idem_account_roles
    FOR SELECT USING (role_name = current_user);
GRANT SELECT ON :"idem_schema".idem_account_roles TO PUBLIC;

-- One policy for every command, the same expression for the rows a role
-- may see (USING) and the rows it may write (WITH CHECK): a row a role can
-- insert is always a row it can see, so the gate's lookup after a lost
-- insert never comes back empty because of this policy.
ALTER TABLE :"idem_schema".idem_records ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS idem_records_by_account ON :"idem_schema".idem_records;
CREATE POLICY idem_records_by_account ON :"idem_schema".idem_records
    USING (account IN (SELECT account FROM :"idem_schema".idem_account_roles
                       WHERE role_name = current_user))
    WITH CHECK (account IN (SELECT account FROM :"idem_schema".idem_account_roles
                            WHERE role_name = current_user));
