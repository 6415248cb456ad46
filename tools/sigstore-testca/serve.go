// The -serve mode: a test Fulcio (v2 signingCert) and Rekor (v1 log entries, dsse/0.0.1) on a local
// address, for keyless signing with sigstore-python's own SigningContext, plus the OIDC side: an
// identity token signed by a throwaway OIDC key that this Fulcio checks before it issues a certificate.
//
// It writes a client trust config (trusted root and signing config naming the served URLs), the
// trusted_root.json alone, and the token; prints "ready" on stdout; and serves until stdin closes.
// Every key lives only in memory: nothing it issues is worth anything outside a test.
package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/testing/ca"
	"github.com/sigstore/sigstore-go/pkg/tlog"
)

type testInstance struct {
	mu        sync.Mutex
	vs        *ca.VirtualSigstore
	rootCert  *x509.Certificate
	interCert *x509.Certificate
	interKey  *ecdsa.PrivateKey
	ctKey     *ecdsa.PrivateKey
	oidcKey   *ecdsa.PrivateKey
}

func serve(listen, identity, issuer, rootOut, configOut, tokenOut string) error {
	if identity == "" || issuer == "" || rootOut == "" || configOut == "" || tokenOut == "" {
		return errors.New("-serve needs -identity, -issuer, -trusted-root, -trust-config and -token")
	}
	vs, err := ca.NewVirtualSigstore()
	if err != nil {
		return err
	}
	rootCert, rootKey, err := ca.GenerateRootCa()
	if err != nil {
		return err
	}
	interCert, interKey, err := ca.GenerateFulcioIntermediate(rootCert, rootKey)
	if err != nil {
		return err
	}
	ctKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	oidcKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	t := &testInstance{vs: vs, rootCert: rootCert, interCert: interCert, interKey: interKey, ctKey: ctKey,
		oidcKey: oidcKey}

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	base := "http://" + ln.Addr().String()
	now := time.Now().Truncate(time.Second)
	start := now.Add(-time.Hour)

	logID, err := vs.RekorLogID()
	if err != nil {
		return err
	}
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01,
		[]root.CertificateAuthority{&root.FulcioCertificateAuthority{Root: rootCert,
			Intermediates: []*x509.Certificate{interCert}, ValidityPeriodStart: start, URI: base}},
		logs("https://ctlog.sigstore-testca.invalid", ctKey.Public(), start),
		vs.TimestampingAuthorities(),
		logs(base, vs.RekorLogs()[logID].PublicKey, start))
	if err != nil {
		return err
	}
	rootJSON, err := tr.MarshalJSON()
	if err != nil {
		return err
	}
	service := func() map[string]any {
		return map[string]any{"url": base, "majorApiVersion": 1, "operator": "sigstore-testca",
			"validFor": map[string]any{"start": start.UTC().Format(time.RFC3339)}}
	}
	signing := map[string]any{
		"mediaType":       "application/vnd.dev.sigstore.signingconfig.v0.2+json",
		"caUrls":          []any{service()},
		"oidcUrls":        []any{},
		"rekorTlogUrls":   []any{service()},
		"tsaUrls":         []any{},
		"rekorTlogConfig": map[string]any{"selector": "ANY"},
		"tsaConfig":       map[string]any{"selector": "ANY"},
	}
	config, err := json.Marshal(map[string]any{
		"mediaType":     "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
		"trustedRoot":   json.RawMessage(rootJSON),
		"signingConfig": signing,
	})
	if err != nil {
		return err
	}
	token, err := t.token(identity, issuer, now)
	if err != nil {
		return err
	}
	for path, data := range map[string][]byte{rootOut: rootJSON, configOut: config, tokenOut: []byte(token)} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/api/v2/signingCert", t.signingCert)
	mux.HandleFunc("/api/v1/log/entries", t.logEntries)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println("ready", base)
	_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin)) // serve until the caller closes stdin
	return srv.Close()
}

// token is a compact ES256 JWT (audience "sigstore", valid 10 minutes) signed by the test OIDC key.
func (t *testInstance) token(identity, issuer string, now time.Time) (string, error) {
	claims := map[string]any{"iss": issuer, "sub": identity, "aud": "sigstore", "iat": now.Unix(),
		"nbf": now.Unix(), "exp": now.Add(10 * time.Minute).Unix()}
	if !strings.Contains(identity, "://") {
		claims["email"] = identity
		claims["email_verified"] = true
	}
	header, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT"})
	body, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	signed := enc.EncodeToString(header) + "." + enc.EncodeToString(body)
	digest := sha256.Sum256([]byte(signed))
	r, s, err := ecdsa.Sign(rand.Reader, t.oidcKey, digest[:])
	if err != nil {
		return "", err
	}
	sig := append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
	return signed + "." + enc.EncodeToString(sig), nil
}

// claims checks the token's signature (the test OIDC key), audience and validity window.
func (t *testInstance) claims(token string) (map[string]any, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("the identity token is not a compact JWT")
	}
	enc := base64.RawURLEncoding
	sig, err := enc.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return nil, errors.New("the identity token's signature is malformed")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !ecdsa.Verify(&t.oidcKey.PublicKey, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return nil, errors.New("the identity token is not signed by this test instance's OIDC key")
	}
	raw, err := enc.DecodeString(parts[1])
	if err != nil {
		return nil, err
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		return nil, err
	}
	exp, _ := claims["exp"].(float64)
	if claims["aud"] != "sigstore" || int64(exp) < time.Now().Unix() {
		return nil, errors.New("the identity token is expired or not for the audience sigstore")
	}
	return claims, nil
}

func httpError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": err.Error()})
}

// signingCert is Fulcio's POST /api/v2/signingCert: a CSR (its signature proves possession of the key)
// and a bearer identity token in; a leaf certificate with one embedded SCT and its chain out.
func (t *testInstance) signingCert(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		httpError(w, http.StatusMethodNotAllowed, errors.New("POST only"))
		return
	}
	claims, err := t.claims(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	if err != nil {
		httpError(w, http.StatusUnauthorized, err)
		return
	}
	var req struct {
		CSR string `json:"certificateSigningRequest"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	pemBytes, err := base64.StdEncoding.DecodeString(req.CSR)
	block, _ := pem.Decode(pemBytes)
	if err != nil || block == nil {
		httpError(w, http.StatusBadRequest, errors.New("certificateSigningRequest is not a base64 PEM CSR"))
		return
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("CSR: %w", err))
		return
	}
	identity, _ := claims["email"].(string)
	if identity == "" {
		identity, _ = claims["sub"].(string)
	}
	issuer, _ := claims["iss"].(string)
	t.mu.Lock()
	leaf, err := leafWithSCT(identity, issuer, time.Now().Truncate(time.Second), csr.PublicKey, t.interCert,
		t.interKey, t.ctKey)
	t.mu.Unlock()
	if err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	chain := []string{}
	for _, c := range []*x509.Certificate{leaf, t.interCert, t.rootCert} {
		chain = append(chain, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"signedCertificateEmbeddedSct": map[string]any{"chain": map[string]any{"certificates": chain}}})
}

// logEntries is Rekor's POST /api/v1/log/entries for a dsse/0.0.1 proposed entry: the entry, its
// signed entry timestamp and an inclusion proof with a signed checkpoint (sigstore-go's VirtualSigstore).
func (t *testInstance) logEntries(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		httpError(w, http.StatusMethodNotAllowed, errors.New("POST only"))
		return
	}
	var req struct {
		Kind string `json:"kind"`
		Spec struct {
			ProposedContent struct {
				Envelope  string   `json:"envelope"`
				Verifiers []string `json:"verifiers"`
			} `json:"proposedContent"`
		} `json:"spec"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 16<<20)).Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if req.Kind != "dsse" || len(req.Spec.ProposedContent.Verifiers) != 1 {
		httpError(w, http.StatusBadRequest, errors.New("this test Rekor takes dsse entries with one verifier only"))
		return
	}
	var env dsse.Envelope
	if err := json.Unmarshal([]byte(req.Spec.ProposedContent.Envelope), &env); err != nil || len(env.Signatures) != 1 {
		httpError(w, http.StatusBadRequest, errors.New("the envelope is not a DSSE envelope with one signature"))
		return
	}
	sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	certPEM, err := base64.StdEncoding.DecodeString(req.Spec.ProposedContent.Verifiers[0])
	block, _ := pem.Decode(certPEM)
	if err != nil || block == nil {
		httpError(w, http.StatusBadRequest, errors.New("the verifier is not a base64 PEM certificate"))
		return
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now().Unix()
	entry, err := t.vs.GenerateTlogEntry(leaf, &env, sig, now, true)
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("rekor entry: %w", err))
		return
	}
	tle := entry.TransparencyLogEntry()
	logID, err := t.vs.RekorLogID()
	if err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	set, err := t.vs.RekorSignPayload(tlog.RekorPayload{Body: base64.StdEncoding.EncodeToString(tle.CanonicalizedBody),
		IntegratedTime: tle.IntegratedTime, LogIndex: tle.LogIndex, LogID: logID})
	if err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	proof := tle.InclusionProof
	hashes := []string{}
	for _, h := range proof.Hashes {
		hashes = append(hashes, hex.EncodeToString(h))
	}
	uuid := sha256.Sum256(tle.CanonicalizedBody)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{hex.EncodeToString(uuid[:]): map[string]any{
		"body":           base64.StdEncoding.EncodeToString(tle.CanonicalizedBody),
		"integratedTime": tle.IntegratedTime,
		"logID":          logID,
		"logIndex":       tle.LogIndex,
		"verification": map[string]any{
			"signedEntryTimestamp": base64.StdEncoding.EncodeToString(set),
			"inclusionProof": map[string]any{
				"logIndex":   proof.LogIndex,
				"rootHash":   hex.EncodeToString(proof.RootHash),
				"treeSize":   proof.TreeSize,
				"hashes":     hashes,
				"checkpoint": proof.Checkpoint.Envelope,
			},
		},
	}})
}
