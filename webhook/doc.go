// Package webhook signs and verifies deliveries per the Standard Webhooks
// specification (standardwebhooks.com, "Signature scheme"): three request
// headers,
//
//   - webhook-id: the message id, the same on every attempt of one
//     message (fairshard sends the row's dispatch_key);
//   - webhook-timestamp: the attempt's time, integer Unix seconds;
//   - webhook-signature: space-separated "v1,<base64 signature>", one per
//     secret, the signature being HMAC-SHA256 with the secret's key over
//     "<webhook-id>.<webhook-timestamp>.<body>" in standard base64.
//
// A secret is written "whsec_" + the standard base64 of its key; the key
// is 24–64 bytes (the specification's recommended range). Several secrets
// sign one request during a rotation: the target accepts the request when
// any signature matches a secret it knows.
//
// The package is a leaf (standard library only): the dispatcher signs
// with it, `fairshard target` verifies with it, and a Go target may too.
package webhook
