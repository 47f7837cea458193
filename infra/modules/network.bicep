// The private path to Azure SQL (databaseNetwork 'private'): a VNet whose first subnet the
// Container Apps environment runs in, and a private endpoint of the SQL server in the second,
// resolved through the privatelink private DNS zone linked to the VNet. The server then refuses
// public traffic (sql.bicep, publicNetworkAccess Disabled).
// https://learn.microsoft.com/azure/container-apps/custom-virtual-networks
// https://learn.microsoft.com/azure/azure-sql/database/private-endpoint-overview
//
// The template owns the VNet's subnets: they are declared inline, so every deployment PUTs the
// VNet with exactly these subnets, and a subnet added by hand is deleted (or, in use, fails the
// deployment with InUseSubnetCannotBeDeleted: Azure/bicep#4653, Azure/bicep#10605). The
// `management` subnet is therefore declared here too: the machine that runs database setup
// (docs/deploy.md, "The private path from an empty subscription") lives in it, and
// infra/setup-database.sh's own redeployment keeps it.

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

@description('Subnet for a management machine (database setup runs inside the VNet), declared inline so redeployments keep it; empty = no such subnet.')
param managementSubnetPrefix string = '10.20.3.0/27'

@description('Resource ids of other VNets (a hub, a peered VNet with a jump box or VPN gateway) to link to the privatelink zone, so machines there resolve the server to its private endpoint.')
param dnsZoneLinkVnetIds array = []

@description('Resource id of an existing privatelink.database.windows.net zone (hub-and-spoke landing zones keep one central zone, linked to the hub); empty = create one in this resource group and link it to the VNet.')
param existingSqlDnsZoneId string = ''

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
    subnets: concat([
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
    ], empty(managementSubnetPrefix) ? [] : [
      {
        name: 'management'
        properties: {
          addressPrefix: managementSubnetPrefix
        }
      }
    ])
  }
}

var createZone = empty(existingSqlDnsZoneId)

// privatelink.database.windows.net in the public cloud; the cloud's own suffix elsewhere.
resource sqlZone 'Microsoft.Network/privateDnsZones@2024-06-01' = if (createZone) {
  name: 'privatelink${environment().suffixes.sqlServerHostname}'
  location: 'global'
  tags: tags
}

resource sqlZoneLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = if (createZone) {
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

// A VM in a peered VNet resolves the server through the zones linked to its own VNet: without
// a link there it gets the public address, which public access disabled refuses.
resource peerLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = [
  for (vnetId, i) in dnsZoneLinkVnetIds: if (createZone) {
    parent: sqlZone
    name: '${namePrefix}-peer-link-${i}'
    location: 'global'
    tags: tags
    properties: {
      registrationEnabled: false
      virtualNetwork: {
        id: vnetId
      }
    }
  }
]

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
          privateDnsZoneId: createZone ? sqlZone.id : existingSqlDnsZoneId
        }
      }
    ]
  }
}

@description('The VNet: main.bicep names its apps subnet by resourceId for the environment.')
output vnetName string = vnet.name

@description('The management subnet (database setup inside the VNet), or empty.')
output managementSubnetName string = empty(managementSubnetPrefix) ? '' : 'management'
