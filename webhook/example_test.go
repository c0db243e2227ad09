package webhook_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/fairshard/fairshard/webhook"
)

// A delivery signed with two secrets during a rotation verifies with
// either; the signature of the specification's example is the published
// one.
func ExampleVerify() {
	oldS, _ := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	newS, _ := webhook.ParseSecret(webhook.NewSecret())
	sent := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)

	h := http.Header{}
	webhook.Sign(h, "msg_p5jXN8AQM9LWM0D4loKWxJek", sent, body, newS, oldS)
	fmt.Println(webhook.Verify(h, body, sent.Add(time.Second), 0, oldS))
	fmt.Println(webhook.Verify(h, body, sent.Add(time.Second), 0, newS))
	fmt.Println(webhook.Signature("msg_p5jXN8AQM9LWM0D4loKWxJek", sent.Unix(), body, oldS))
	// Output:
	// <nil>
	// <nil>
	// v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}
