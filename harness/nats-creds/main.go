// nats-creds writes what a NATS server in operator mode and its clients need, for the tests of
// `.creds` files: an operator, an account with JetStream, and a user of that account.
//
//	nats-creds DIR
//
// writes DIR/server.conf (the operator, the account preloaded in a memory resolver, JetStream
// enabled for the account) and DIR/user.creds (the user's JWT and nkey seed), and also
// DIR/stranger.creds: a user signed by an account the server does not know.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: nats-creds DIR")
		os.Exit(2)
	}
	if err := write(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "nats-creds:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	operator, _ := nkeys.CreateOperator()
	operatorPub, _ := operator.PublicKey()
	operatorClaims := jwt.NewOperatorClaims(operatorPub)
	operatorClaims.Name = "mdrelay-test"
	operatorJWT, err := operatorClaims.Encode(operator)
	if err != nil {
		return err
	}
	system, systemJWT, err := account(operator, "SYS", false)
	if err != nil {
		return err
	}
	systemPub, _ := system.PublicKey()
	feed, feedJWT, err := account(operator, "FEED", true)
	if err != nil {
		return err
	}
	feedPub, _ := feed.PublicKey()
	conf := fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %s\n  %s: %s\n}\n",
		operatorJWT, systemPub, systemPub, systemJWT, feedPub, feedJWT)
	if err := os.WriteFile(filepath.Join(dir, "server.conf"), []byte(conf), 0o600); err != nil {
		return err
	}
	if err := creds(feed, filepath.Join(dir, "user.creds")); err != nil {
		return err
	}
	// An account of the same operator that the server was not told about.
	stranger, _, err := account(operator, "STRANGER", true)
	if err != nil {
		return err
	}
	return creds(stranger, filepath.Join(dir, "stranger.creds"))
}

// account makes an account signed by the operator, with JetStream without limits if asked.
func account(operator nkeys.KeyPair, name string, jetstream bool) (nkeys.KeyPair, string, error) {
	kp, _ := nkeys.CreateAccount()
	pub, _ := kp.PublicKey()
	claims := jwt.NewAccountClaims(pub)
	claims.Name = name
	if jetstream {
		claims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	token, err := claims.Encode(operator)
	return kp, token, err
}

// creds writes a new user of `account` as a .creds file.
func creds(account nkeys.KeyPair, path string) error {
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	claims := jwt.NewUserClaims(pub)
	claims.Name = "feed"
	token, err := claims.Encode(account)
	if err != nil {
		return err
	}
	seed, _ := user.Seed()
	text, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return err
	}
	return os.WriteFile(path, text, 0o600)
}
