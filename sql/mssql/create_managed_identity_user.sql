-- Creates the database user of a managed identity and grants it the least it needs.
-- Not a migration (sb-inbox migrate does not apply it): run it once per identity, connected to
-- the application database (not master) as the server's Entra admin, e.g.
--
--   sqlcmd -S tcp:SERVER.database.windows.net,1433 -d sbinbox --authentication-method ActiveDirectoryDefault \
--          -v IdentityName="sbinbox-prod-worker" Role="worker" -i sql/mssql/create_managed_identity_user.sql
--   sqlcmd ... -v IdentityName="sbinbox-prod-migrate" Role="migrate" -i sql/mssql/create_managed_identity_user.sql
--
-- Variables:
--   IdentityName  the managed identity's name (Bicep outputs workerIdentityName, migrateIdentityName)
--   Role          worker:  read and write rows (db_datareader, db_datawriter), no DDL
--                 migrate: the same plus DDL (db_ddladmin), for `sb-inbox migrate` only
-- Idempotent: running it again changes nothing.

SET NOCOUNT ON;
SET XACT_ABORT ON;

IF N'$(Role)' NOT IN (N'worker', N'migrate')
    THROW 50000, N'Role must be worker or migrate.', 1;

IF DATABASE_PRINCIPAL_ID(N'$(IdentityName)') IS NULL
    CREATE USER [$(IdentityName)] FROM EXTERNAL PROVIDER;

IF IS_ROLEMEMBER(N'db_datareader', N'$(IdentityName)') = 0
    ALTER ROLE db_datareader ADD MEMBER [$(IdentityName)];

IF IS_ROLEMEMBER(N'db_datawriter', N'$(IdentityName)') = 0
    ALTER ROLE db_datawriter ADD MEMBER [$(IdentityName)];

IF N'$(Role)' = N'migrate' AND IS_ROLEMEMBER(N'db_ddladmin', N'$(IdentityName)') = 0
    ALTER ROLE db_ddladmin ADD MEMBER [$(IdentityName)];

-- A worker that was once a migration identity loses DDL.
IF N'$(Role)' = N'worker' AND IS_ROLEMEMBER(N'db_ddladmin', N'$(IdentityName)') = 1
    ALTER ROLE db_ddladmin DROP MEMBER [$(IdentityName)];

SELECT p.name AS [user], r.name AS [role]
FROM sys.database_role_members AS m
JOIN sys.database_principals AS r ON r.principal_id = m.role_principal_id
JOIN sys.database_principals AS p ON p.principal_id = m.member_principal_id
WHERE p.name = N'$(IdentityName)'
ORDER BY r.name;
