-- Creates the database user of a managed identity and grants it the least it needs.
-- Not a migration (sb-inbox migrate does not apply it): run it once per identity, connected to
-- the application database (not master) as the server's Entra admin (a member of the admin
-- group). infra/setup-database.sh runs it for both identities with the deployment's outputs;
-- by hand:
--
--   sqlcmd -S tcp:SERVER.database.windows.net,1433 -d sbinbox --authentication-method ActiveDirectoryDefault -b \
--          -v IdentityName="sbinbox-prod-worker" ClientId="<workerIdentityClientId>" Role="worker" \
--          -i sql/mssql/create_managed_identity_user.sql
--
-- Variables:
--   IdentityName  the database user's name: the identity's name (outputs workerIdentityName,
--                 migrateIdentityName)
--   ClientId      the identity's client (application) id (outputs workerIdentityClientId,
--                 migrateIdentityClientId). The user is created WITH SID = <client id as
--                 binary>, TYPE = E: no Microsoft Graph lookup at all. FROM EXTERNAL PROVIDER
--                 (with or without WITH OBJECT_ID, which the reference calls "a troubleshooting
--                 repair item … for use with nonunique service principals") asks Graph, and when
--                 the admin running it is a service principal the server itself must then hold
--                 Directory Readers; a display name shared by two principals could also resolve
--                 the wrong one. The SID form works for a human admin and a pipeline alike
--                 (https://learn.microsoft.com/sql/t-sql/statements/create-user-transact-sql,
--                 "SID" and "TYPE").
--   Role          worker:  read and write rows (db_datareader, db_datawriter), no DDL
--                 migrate: the same plus DDL (db_ddladmin), for `sb-inbox migrate` only
-- Idempotent: running it again changes nothing. A user of that name made for an earlier
-- identity keeps its SID: DROP USER it first when the identity was recreated.

SET NOCOUNT ON;
SET XACT_ABORT ON;

IF N'$(Role)' NOT IN (N'worker', N'migrate')
    THROW 50000, N'Role must be worker or migrate.', 1;

IF TRY_CONVERT(uniqueidentifier, N'$(ClientId)') IS NULL
    THROW 50000, N'ClientId must be the identity''s client (application) id, a GUID.', 1;

-- CREATE USER takes the SID as a binary literal only: built as text (style 1 keeps the 0x).
IF DATABASE_PRINCIPAL_ID(N'$(IdentityName)') IS NULL
BEGIN
    DECLARE @sid nvarchar(40) =
        CONVERT(nvarchar(40), CAST(CAST(N'$(ClientId)' AS uniqueidentifier) AS varbinary(16)), 1);
    DECLARE @create nvarchar(400) =
        N'CREATE USER ' + QUOTENAME(N'$(IdentityName)') + N' WITH SID = ' + @sid + N', TYPE = E;';
    EXEC (@create);
END;

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
