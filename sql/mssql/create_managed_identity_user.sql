-- Creates the database user of a managed identity and grants it the least it needs.
-- Not a migration (sb-inbox migrate does not apply it): run it once per identity, connected to
-- the application database (not master) as the server's Entra admin. infra/setup-database.sh
-- runs it for both identities with the deployment's outputs; by hand:
--
--   sqlcmd -S tcp:SERVER.database.windows.net,1433 -d sbinbox --authentication-method ActiveDirectoryDefault -b \
--          -v IdentityName="sbinbox-prod-worker" ObjectId="<workerPrincipalId>" Role="worker" \
--          -i sql/mssql/create_managed_identity_user.sql
--
-- Variables:
--   IdentityName  the database user's name: the identity's name (outputs workerIdentityName,
--                 migrateIdentityName)
--   ObjectId      the identity's object (principal) id (outputs workerPrincipalId,
--                 migratePrincipalId). The user is created WITH OBJECT_ID: a display name is not
--                 unique in a tenant, so FROM EXTERNAL PROVIDER alone could resolve another
--                 principal of the same name (or fail as ambiguous), and it needs Microsoft Graph
--                 rights that a pipeline identity lacks
--                 (https://learn.microsoft.com/sql/t-sql/statements/create-user-transact-sql).
--   Role          worker:  read and write rows (db_datareader, db_datawriter), no DDL
--                 migrate: the same plus DDL (db_ddladmin), for `sb-inbox migrate` only
-- Idempotent: running it again changes nothing.

SET NOCOUNT ON;
SET XACT_ABORT ON;

IF N'$(Role)' NOT IN (N'worker', N'migrate')
    THROW 50000, N'Role must be worker or migrate.', 1;

IF TRY_CONVERT(uniqueidentifier, N'$(ObjectId)') IS NULL
    THROW 50000, N'ObjectId must be the identity''s object (principal) id, a GUID.', 1;

IF DATABASE_PRINCIPAL_ID(N'$(IdentityName)') IS NULL
    CREATE USER [$(IdentityName)] FROM EXTERNAL PROVIDER WITH OBJECT_ID = '$(ObjectId)';

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
