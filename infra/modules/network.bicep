// The private path to Azure SQL (databaseNetwork 'private'): a VNet whose first subnet the
// Container Apps environment runs in, and a private endpoint of the SQL server in the second,
// resolved through the privatelink private DNS zone linked to the VNet. The server then refuses
// public traffic (sql.bicep, publicNetworkAccess Disabled).
// https://learn.microsoft.com/azure/container-apps/custom-virtual-networks
// https://learn.microsoft.com/azure/azure-sql/database/private-endpoint-overview

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Resource id of the SQL logical server the private endpoint connects to.')
param sqlServerId string

@description('Address space of the VNet.')
param addressPrefix string = '10.20.0.0/16'

@description('Subnet of the Container Apps environment: a workload profiles environment needs at least a /27, delegated to Microsoft.App/environments.')
param appsSubnetPrefix string = '10.20.0.0/23'

@description('Subnet of the private endpoints.')
param endpointsSubnetPrefix string = '10.20.2.0/27'

@description('Tags for every resource.')
param tags object = {}

resource vnet 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: '${namePrefix}-vnet'
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: 'apps'
        properties: {
          addressPrefix: appsSubnetPrefix
          // Workload profiles environments run in a subnet delegated to them.
          delegations: [
            {
              name: 'container-apps'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: 'private-endpoints'
        properties: {
          addressPrefix: endpointsSubnetPrefix
        }
      }
    ]
  }
}

// privatelink.database.windows.net in the public cloud; the cloud's own suffix elsewhere.
resource sqlZone 'Microsoft.Network/privateDnsZones@2024-06-01' = {
  name: 'privatelink${environment().suffixes.sqlServerHostname}'
  location: 'global'
  tags: tags
}

resource sqlZoneLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = {
  parent: sqlZone
  name: '${namePrefix}-vnet-link'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnet.id
    }
  }
}

resource sqlEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: '${namePrefix}-sql-pe'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: vnet.properties.subnets[1].id
    }
    privateLinkServiceConnections: [
      {
        name: 'sql'
        properties: {
          privateLinkServiceId: sqlServerId
          groupIds: [
            'sqlServer'
          ]
        }
      }
    ]
  }
}

// The endpoint's A record in the zone, kept up to date by the platform.
resource sqlEndpointDns 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: sqlEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: 'sql'
        properties: {
          privateDnsZoneId: sqlZone.id
        }
      }
    ]
  }
}

@description('The VNet: main.bicep names its apps subnet by resourceId for the environment.')
output vnetName string = vnet.name
