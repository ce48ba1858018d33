// Command etcd is the conformance kit's one-member etcd for a test control
// plane: go.etcd.io/etcd/server/v3/embed at the version go.mod requires,
// listening on loopback only.
//
// It binds its client and peer listeners (port 0 picks a free port; the
// listener itself holds it, so nothing races for it) and, once the server is
// ready to serve, prints one line on stdout:
//
//	etcd: serving https://127.0.0.1:PORT
//
// A caller reads that line instead of polling. SIGTERM or SIGINT closes the
// server (exit 0); a server error exits 1.
//
// TLS, with client certificates required on both listeners, when --cert-file,
// --key-file and --trusted-ca-file are given (the usual case): loopback keeps
// other machines out, but not other users of this one, and a plain etcd port
// would hand any local process the whole cluster's data past the API
// server's authentication and RBAC. The caller already has a CA for the API
// server, so this costs three files. Without them it serves plain HTTP.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

const readyTimeout = 60 * time.Second

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	}
}

func loopbackURL(flagName, value string) (*url.URL, error) {
	u, err := url.Parse(value)
	if err != nil {
		return nil, fmt.Errorf("--%s %q: %v", flagName, value, err)
	}
	host, _, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("--%s %q: %v; use a URL like https://127.0.0.1:0", flagName, value, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("--%s %q: not a loopback address; use 127.0.0.1", flagName, value)
	}
	return u, nil
}

func run() error {
	dataDir := flag.String("data-dir", "", "the member's data directory (required; created 0700)")
	clientURL := flag.String("listen-client-url", "https://127.0.0.1:0", "client URL on loopback; port 0 picks a free port")
	peerURL := flag.String("listen-peer-url", "https://127.0.0.1:0", "peer URL on loopback; port 0 picks a free port")
	certFile := flag.String("cert-file", "", "serving certificate (PEM), also used as the peer client certificate")
	keyFile := flag.String("key-file", "", "its key (PEM)")
	caFile := flag.String("trusted-ca-file", "", "CA (PEM) that client certificates must chain to")
	logLevel := flag.String("log-level", "warn", "debug, info, warn or error")
	flag.Parse()
	if *dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}
	client, err := loopbackURL("listen-client-url", *clientURL)
	if err != nil {
		return err
	}
	peer, err := loopbackURL("listen-peer-url", *peerURL)
	if err != nil {
		return err
	}
	tls := *certFile != "" || *keyFile != "" || *caFile != ""
	if tls && (*certFile == "" || *keyFile == "" || *caFile == "") {
		return fmt.Errorf("TLS needs all of --cert-file, --key-file and --trusted-ca-file")
	}
	for _, u := range []*url.URL{client, peer} {
		if want := map[bool]string{true: "https", false: "http"}[tls]; u.Scheme != want {
			return fmt.Errorf("%s: use %s:// (TLS is on when --cert-file, --key-file and --trusted-ca-file are given)", u, want)
		}
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	// One member: the advertised URLs only name it (with port 0 they keep the
	// 0); nobody dials them. The HTTP gateway would dial the client URL as
	// written, and the API server speaks gRPC, so it is off.
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.EnableGRPCGateway = false
	// A throwaway test cluster that is never restarted on its data: no fsync.
	cfg.UnsafeNoFsync = true
	if tls {
		cfg.ClientTLSInfo.CertFile = *certFile
		cfg.ClientTLSInfo.KeyFile = *keyFile
		cfg.ClientTLSInfo.TrustedCAFile = *caFile
		cfg.ClientTLSInfo.ClientCertAuth = true
		cfg.PeerTLSInfo = cfg.ClientTLSInfo
	}

	// Signals are taken before the start, so that a SIGTERM during it is not lost.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return err
	case sig := <-signals:
		fmt.Fprintf(os.Stderr, "etcd: %v before ready, stopping\n", sig)
		return nil
	case <-time.After(readyTimeout):
		return fmt.Errorf("not ready after %v; see the log above", readyTimeout)
	}
	served := *client
	served.Host = e.Clients[0].Addr().String()
	fmt.Printf("etcd: serving %s\n", served.String())

	select {
	case sig := <-signals:
		fmt.Fprintf(os.Stderr, "etcd: %v, stopping\n", sig)
		return nil
	case err := <-e.Err():
		return err
	case <-e.Server.StopNotify():
		return fmt.Errorf("the server stopped by itself; see the log above")
	}
}
