// Command sigstore-testca signs an in-toto Statement into a Sigstore bundle (v0.3, DSSE) entirely
// offline, against a throwaway test trust root that it also writes out as trusted_root.json.
//
// Rekor (dsse/0.0.1 entry, SET, inclusion proof and checkpoint) and the timestamp authority come from
// sigstore-go's pkg/testing/ca.VirtualSigstore.  The Fulcio CA and the CT log are made here, because
// VirtualSigstore's leaf certificates carry no SCT and sigstore-python requires exactly one.
// Every key lives only in memory: the output is for tests and is worthless as trust material.
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	protorekor "github.com/sigstore/protobuf-specs/gen/pb-go/rekor/v1"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/testing/ca"
	"github.com/sigstore/sigstore-go/pkg/tlog"
	"google.golang.org/protobuf/encoding/protojson"
)

const (
	inTotoPayloadType = "application/vnd.in-toto+json"
	bundleMediaType   = "application/vnd.dev.sigstore.bundle.v0.3+json"
)

var (
	oidIssuerV1 = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 1}
	oidIssuerV2 = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 8}
	oidSCTList  = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 11129, 2, 4, 2}
)

func main() {
	identity := flag.String("identity", "", "certificate identity (an e-mail address or a URI)")
	issuer := flag.String("issuer", "", "OIDC issuer written into the certificate")
	statement := flag.String("statement", "-", "in-toto Statement JSON to sign ('-' for stdin)")
	bundleOut := flag.String("bundle", "", "where to write the Sigstore bundle JSON")
	rootOut := flag.String("trusted-root", "", "where to write trusted_root.json")
	listen := flag.String("serve", "", "serve a test Fulcio and Rekor (v1 API) on this address, e.g. 127.0.0.1:0, "+
		"instead of signing one statement (see serve.go)")
	configOut := flag.String("trust-config", "", "with -serve: where to write the client trust config (trusted root "+
		"and signing config naming the served URLs)")
	tokenOut := flag.String("token", "", "with -serve: where to write an OIDC identity token for -identity/-issuer")
	flag.Parse()
	var err error
	if *listen != "" {
		err = serve(*listen, *identity, *issuer, *rootOut, *configOut, *tokenOut)
	} else {
		err = run(*identity, *issuer, *statement, *bundleOut, *rootOut)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sigstore-testca:", err)
		os.Exit(1)
	}
}

func run(identity, issuer, statementPath, bundleOut, rootOut string) error {
	if identity == "" || issuer == "" || bundleOut == "" || rootOut == "" {
		return errors.New("-identity, -issuer, -bundle and -trusted-root are required")
	}
	var payload []byte
	var err error
	if statementPath == "-" {
		payload, err = io.ReadAll(io.LimitReader(os.Stdin, 8<<20))
	} else {
		payload, err = os.ReadFile(statementPath)
	}
	if err != nil {
		return err
	}
	now := time.Now().Truncate(time.Second)

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
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf, err := leafWithSCT(identity, issuer, now, leafKey.Public(), interCert, interKey, ctKey)
	if err != nil {
		return err
	}

	pae := fmt.Sprintf("DSSEv1 %d %s %d ", len(inTotoPayloadType), inTotoPayloadType, len(payload))
	digest := sha256.Sum256(append([]byte(pae), payload...))
	sig, err := ecdsa.SignASN1(rand.Reader, leafKey, digest[:])
	if err != nil {
		return err
	}
	env := &dsse.Envelope{PayloadType: inTotoPayloadType, Payload: base64.StdEncoding.EncodeToString(payload),
		Signatures: []dsse.Signature{{Sig: base64.StdEncoding.EncodeToString(sig)}}}

	entry, err := vs.GenerateTlogEntry(leaf, env, sig, now.Unix(), true)
	if err != nil {
		return fmt.Errorf("rekor entry: %w", err)
	}
	tle := entry.TransparencyLogEntry()
	logID, err := vs.RekorLogID()
	if err != nil {
		return err
	}
	set, err := vs.RekorSignPayload(tlog.RekorPayload{Body: base64.StdEncoding.EncodeToString(tle.CanonicalizedBody),
		IntegratedTime: tle.IntegratedTime, LogIndex: tle.LogIndex, LogID: logID})
	if err != nil {
		return err
	}
	tle.KindVersion = &protorekor.KindVersion{Kind: "dsse", Version: "0.0.1"}
	tle.InclusionPromise = &protorekor.InclusionPromise{SignedEntryTimestamp: set}
	tsr, err := vs.TimestampResponse(sig)
	if err != nil {
		return err
	}

	b := &protobundle.Bundle{
		MediaType: bundleMediaType,
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content:     &protobundle.VerificationMaterial_Certificate{Certificate: &protocommon.X509Certificate{RawBytes: leaf.Raw}},
			TlogEntries: []*protorekor.TransparencyLogEntry{tle},
			TimestampVerificationData: &protobundle.TimestampVerificationData{
				Rfc3161Timestamps: []*protocommon.RFC3161SignedTimestamp{{SignedTimestamp: tsr}}},
		},
		Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{
			Payload: payload, PayloadType: inTotoPayloadType, Signatures: []*protodsse.Signature{{Sig: sig}}}},
	}
	bundleJSON, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(b)
	if err != nil {
		return err
	}

	rekorPub := vs.RekorLogs()[logID].PublicKey
	start := now.Add(-time.Hour)
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01,
		[]root.CertificateAuthority{&root.FulcioCertificateAuthority{Root: rootCert,
			Intermediates: []*x509.Certificate{interCert}, ValidityPeriodStart: start,
			URI: "https://fulcio.sigstore-testca.invalid"}},
		logs("https://ctlog.sigstore-testca.invalid", ctKey.Public(), start),
		vs.TimestampingAuthorities(),
		logs("https://rekor.localhost", rekorPub, start))
	if err != nil {
		return err
	}
	rootJSON, err := tr.MarshalJSON()
	if err != nil {
		return err
	}
	if err := os.WriteFile(bundleOut, bundleJSON, 0o644); err != nil {
		return err
	}
	return os.WriteFile(rootOut, rootJSON, 0o644)
}

// logs describes one log whose ID is the SHA-256 of its key's SubjectPublicKeyInfo (RFC 6962).
func logs(baseURL string, pub crypto.PublicKey, start time.Time) map[string]*root.TransparencyLog {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	id := sha256.Sum256(der)
	return map[string]*root.TransparencyLog{hex.EncodeToString(id[:]): {BaseURL: baseURL, ID: id[:],
		ValidityPeriodStart: start, HashFunc: crypto.SHA256, PublicKey: pub, SignatureHashFunc: crypto.SHA256}}
}

// leafWithSCT issues a Fulcio-style leaf certificate with one embedded precertificate SCT.
// The SCT signs the TBSCertificate without the SCT-list extension, which is what a verifier rebuilds.
func leafWithSCT(identity, issuer string, now time.Time, pub crypto.PublicKey, parent *x509.Certificate,
	parentKey *ecdsa.PrivateKey, ctKey *ecdsa.PrivateKey) (*x509.Certificate, error) {
	issuerV2, err := asn1.MarshalWithParams(issuer, "utf8")
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(10 * time.Minute),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
		ExtraExtensions: []pkix.Extension{{Id: oidIssuerV1, Value: []byte(issuer)}, {Id: oidIssuerV2, Value: issuerV2}},
	}
	if strings.Contains(identity, "://") {
		u, err := url.Parse(identity)
		if err != nil {
			return nil, err
		}
		tmpl.URIs = []*url.URL{u}
	} else {
		tmpl.EmailAddresses = []string{identity}
	}
	pre, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, err
	}
	preCert, err := x509.ParseCertificate(pre)
	if err != nil {
		return nil, err
	}
	sct, err := signSCT(preCert.RawTBSCertificate, parent.RawSubjectPublicKeyInfo, now, ctKey)
	if err != nil {
		return nil, err
	}
	list := binary.BigEndian.AppendUint16(nil, uint16(2+len(sct)))
	list = binary.BigEndian.AppendUint16(list, uint16(len(sct)))
	ext, err := asn1.Marshal(append(list, sct...))
	if err != nil {
		return nil, err
	}
	tmpl.ExtraExtensions = append(tmpl.ExtraExtensions, pkix.Extension{Id: oidSCTList, Value: ext})
	final, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(final)
}

// signSCT returns a serialised v1 SCT (RFC 6962 3.2) for a precertificate entry.
func signSCT(tbs, issuerSPKI []byte, now time.Time, ctKey *ecdsa.PrivateKey) ([]byte, error) {
	ts := uint64(now.UnixMilli())
	issuerHash := sha256.Sum256(issuerSPKI)
	signed := []byte{0, 0} // v1, certificate_timestamp
	signed = binary.BigEndian.AppendUint64(signed, ts)
	signed = binary.BigEndian.AppendUint16(signed, 1) // precert_entry
	signed = append(signed, issuerHash[:]...)
	signed = append(signed, byte(len(tbs)>>16), byte(len(tbs)>>8), byte(len(tbs)))
	signed = append(signed, tbs...)
	signed = binary.BigEndian.AppendUint16(signed, 0) // no extensions
	digest := sha256.Sum256(signed)
	sig, err := ecdsa.SignASN1(rand.Reader, ctKey, digest[:])
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(ctKey.Public())
	if err != nil {
		return nil, err
	}
	logID := sha256.Sum256(der)
	out := []byte{0} // v1
	out = append(out, logID[:]...)
	out = binary.BigEndian.AppendUint64(out, ts)
	out = binary.BigEndian.AppendUint16(out, 0) // no extensions
	out = append(out, 4, 3)                     // sha256, ecdsa
	out = binary.BigEndian.AppendUint16(out, uint16(len(sig)))
	return append(out, sig...), nil
}
