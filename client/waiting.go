package client

import "github.com/fairshard/fairshard/api"

// Waiting is why a live row has not been delivered yet, as the node
// holding it sees it (GET /v1/rows/{dispatch_key}'s `waiting`): package
// api's type.
type Waiting = api.Waiting
