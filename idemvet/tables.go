package idemvet

import (
	"go/types"
	"strings"
)

// The tables below name functions, methods and fields by package path:
// "pkgpath.Func", "pkgpath.Type.Method", "pkgpath.Type.Field".

const (
	pkgIdem      = "github.com/idemkit/idem"
	pkgQueue     = "github.com/idemkit/idem/queue"
	pkgWebhook   = "github.com/idemkit/idem/webhook"
	pkgSQS       = "github.com/aws/aws-sdk-go-v2/service/sqs"
	pkgSQSTypes  = "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	pkgSNS       = "github.com/aws/aws-sdk-go-v2/service/sns"
	pkgEvents    = "github.com/aws/aws-lambda-go/events"
	pkgAMQP      = "github.com/rabbitmq/amqp091-go"
	pkgStreadway = "github.com/streadway/amqp"
	pkgNATS      = "github.com/nats-io/nats.go"
	pkgJetStream = "github.com/nats-io/nats.go/jetstream"
	pkgAsynq     = "github.com/hibiken/asynq"
	pkgRiverType = "github.com/riverqueue/river/rivertype"
	pkgWatermill = "github.com/ThreeDotsLabs/watermill/message"
)

// idGenerators are the functions of id packages that return a new id on
// every call. Name-based ids (uuid.NewSHA1, uuid.NewMD5) and parsers are
// deterministic and not listed.
var idGenerators = map[string]string{
	"github.com/google/uuid.New":                 "uuid.New",
	"github.com/google/uuid.NewString":           "uuid.NewString",
	"github.com/google/uuid.NewRandom":           "uuid.NewRandom",
	"github.com/google/uuid.NewRandomFromReader": "uuid.NewRandomFromReader",
	"github.com/google/uuid.NewUUID":             "uuid.NewUUID",
	"github.com/google/uuid.NewV6":               "uuid.NewV6",
	"github.com/google/uuid.NewV7":               "uuid.NewV7",
	"github.com/gofrs/uuid.NewV1":                "uuid.NewV1",
	"github.com/gofrs/uuid.NewV4":                "uuid.NewV4",
	"github.com/gofrs/uuid.NewV6":                "uuid.NewV6",
	"github.com/gofrs/uuid.NewV7":                "uuid.NewV7",
	"github.com/gofrs/uuid/v5.NewV1":             "uuid.NewV1",
	"github.com/gofrs/uuid/v5.NewV4":             "uuid.NewV4",
	"github.com/gofrs/uuid/v5.NewV6":             "uuid.NewV6",
	"github.com/gofrs/uuid/v5.NewV7":             "uuid.NewV7",
	"github.com/satori/go.uuid.NewV1":            "uuid.NewV1",
	"github.com/satori/go.uuid.NewV4":            "uuid.NewV4",
	"github.com/segmentio/ksuid.New":             "ksuid.New",
	"github.com/segmentio/ksuid.NewRandom":       "ksuid.NewRandom",
	"github.com/rs/xid.New":                      "xid.New",
	"github.com/rs/xid.NewWithTime":              "xid.NewWithTime",
	"github.com/oklog/ulid.Make":                 "ulid.Make",
	"github.com/oklog/ulid.MustNew":              "ulid.MustNew",
	"github.com/oklog/ulid/v2.Make":              "ulid.Make",
	"github.com/oklog/ulid/v2.MustNew":           "ulid.MustNew",
	"github.com/lithammer/shortuuid.New":         "shortuuid.New",
	"github.com/lithammer/shortuuid/v4.New":      "shortuuid.New",
	"github.com/nats-io/nuid.Next":               "nuid.Next",
	"github.com/nats-io/nuid.NUID.Next":          "nuid.Next",
	"github.com/teris-io/shortid.Generate":       "shortid.Generate",
}

// nondetSource says which nondeterministic source fn is ("" if none).
func nondetSource(fn *types.Func, name string) string {
	if what, ok := idGenerators[name]; ok {
		return what
	}
	switch name {
	case "time.Now", "time.Since", "time.Until":
		return name
	case "crypto/rand.Read", "crypto/rand.Int", "crypto/rand.Prime", "crypto/rand.Text":
		return "crypto/" + strings.TrimPrefix(name, "crypto/")
	case "sync/atomic.AddInt32", "sync/atomic.AddInt64", "sync/atomic.AddUint32", "sync/atomic.AddUint64", "sync/atomic.AddUintptr",
		"sync/atomic.Int32.Add", "sync/atomic.Int64.Add", "sync/atomic.Uint32.Add", "sync/atomic.Uint64.Add":
		return "a counter (" + strings.TrimPrefix(name, "sync/") + ")"
	}
	if p := fn.Pkg(); p != nil && (p.Path() == "math/rand" || p.Path() == "math/rand/v2") {
		switch fn.Name() {
		case "New", "NewSource", "NewPCG", "NewChaCha8", "NewZipf", "Seed":
			return ""
		}
		return strings.TrimPrefix(name, "math/")
	}
	return ""
}

func isRandPkg(p *types.Package) bool {
	return p != nil && (p.Path() == "math/rand" || p.Path() == "math/rand/v2" || p.Path() == "crypto/rand")
}

// deliveryFields are fields holding a broker's id for one delivery or
// one enqueued copy of a message.
var deliveryFields = map[string]bool{
	pkgSQSTypes + ".Message.MessageId":                true,
	pkgSQSTypes + ".Message.ReceiptHandle":            true,
	pkgEvents + ".SQSMessage.MessageId":               true,
	pkgEvents + ".SQSMessage.ReceiptHandle":           true,
	pkgAMQP + ".Delivery.DeliveryTag":                 true,
	pkgStreadway + ".Delivery.DeliveryTag":            true,
	pkgNATS + ".SequencePair.Stream":                  true,
	pkgNATS + ".SequencePair.Consumer":                true,
	pkgJetStream + ".SequencePair.Stream":             true,
	pkgJetStream + ".SequencePair.Consumer":           true,
	pkgQueue + ".Message.ID":                          true,
	pkgRiverType + ".JobRow.ID":                       true,
	pkgWatermill + ".Message.UUID":                    true,
	"github.com/hibiken/asynq.TaskInfo.ID":            true,
	"github.com/nats-io/nats.go.MsgMetadata.Sequence": true,
}

// deliveryFuncs return such an id.
var deliveryFuncs = map[string]bool{
	pkgAsynq + ".GetTaskID": true,
}

// bodyFields and bodyFuncs hold a whole payload as received.
var bodyFields = map[string]bool{
	"net/http.Request.Body":                      true,
	pkgSQSTypes + ".Message.Body":                true,
	pkgEvents + ".SQSMessage.Body":               true,
	pkgEvents + ".APIGatewayProxyRequest.Body":   true,
	pkgEvents + ".APIGatewayV2HTTPRequest.Body":  true,
	pkgEvents + ".LambdaFunctionURLRequest.Body": true,
	pkgEvents + ".ALBTargetGroupRequest.Body":    true,
	pkgEvents + ".SNSEntity.Message":             true,
	pkgAMQP + ".Delivery.Body":                   true,
	pkgStreadway + ".Delivery.Body":              true,
	pkgNATS + ".Msg.Data":                        true,
	pkgQueue + ".Message.Body":                   true,
	pkgWatermill + ".Message.Payload":            true,
}

var bodyFuncs = map[string]bool{
	pkgJetStream + ".Msg.Data": true,
	pkgAsynq + ".Task.Payload": true,
}

// hashFuncs hash their argument.
var hashFuncs = map[string]bool{
	"crypto/sha256.Sum256":                     true,
	"crypto/sha256.Sum224":                     true,
	"crypto/sha512.Sum512":                     true,
	"crypto/sha512.Sum384":                     true,
	"crypto/sha512.Sum512_224":                 true,
	"crypto/sha512.Sum512_256":                 true,
	"crypto/sha1.Sum":                          true,
	"crypto/md5.Sum":                           true,
	"crypto/sha3.Sum224":                       true,
	"crypto/sha3.Sum256":                       true,
	"crypto/sha3.Sum384":                       true,
	"crypto/sha3.Sum512":                       true,
	"hash/crc32.ChecksumIEEE":                  true,
	"hash/crc32.Checksum":                      true,
	"hash/crc64.Checksum":                      true,
	"hash/adler32.Checksum":                    true,
	"hash/maphash.Bytes":                       true,
	"hash/maphash.String":                      true,
	"github.com/cespare/xxhash/v2.Sum64":       true,
	"github.com/cespare/xxhash/v2.Sum64String": true,
}

// isHashSum reports whether fn is the Sum method of a hash.Hash (or of a
// type with Write and Sum, such as *maphash.Hash).
func isHashSum(fn *types.Func) bool {
	switch fn.Name() {
	case "Sum", "Sum32", "Sum64":
	default:
		return false
	}
	recv := fn.Type().(*types.Signature).Recv().Type()
	ms := types.NewMethodSet(recv)
	if _, ok := recv.Underlying().(*types.Interface); !ok {
		ms = types.NewMethodSet(types.NewPointer(deref(recv)))
	}
	return ms.Lookup(nil, "Write") != nil || lookupAny(ms, "Write")
}

func lookupAny(ms *types.MethodSet, name string) bool {
	for i := range ms.Len() {
		if ms.At(i).Obj().Name() == name {
			return true
		}
	}
	return false
}

// passThroughPkgs are packages whose functions return a value built from
// their arguments.
var passThroughPkgs = map[string]bool{
	"strconv":                          true,
	"strings":                          true,
	"bytes":                            true,
	"encoding/hex":                     true,
	"path":                             true,
	"path/filepath":                    true,
	"unicode/utf8":                     false,
	"github.com/aws/aws-sdk-go-v2/aws": true,
	"github.com/aws/aws-sdk-go/aws":    true,
}

// passThrough reports whether fn's result is built from its arguments.
func passThrough(fn *types.Func, name string) bool {
	switch name {
	case "fmt.Sprint", "fmt.Sprintf", "fmt.Sprintln", "fmt.Append", "fmt.Appendf", "fmt.Appendln",
		"io.ReadAll", "io.LimitReader", "io.NopCloser", "io.TeeReader",
		"net/url.QueryEscape", "net/url.PathEscape",
		"time.Unix", "time.UnixMilli", "time.UnixMicro",
		"encoding/base64.Encoding.EncodeToString", "encoding/base32.Encoding.EncodeToString",
		"encoding/base64.Encoding.Encode", "encoding/base32.Encoding.Encode",
		"encoding/binary.BigEndian.AppendUint64", "encoding/binary.LittleEndian.AppendUint64",
		"encoding/binary.bigEndian.AppendUint64", "encoding/binary.littleEndian.AppendUint64",
		"encoding/binary.bigEndian.Uint64", "encoding/binary.littleEndian.Uint64",
		"net/http.MaxBytesReader",
		"github.com/google/uuid.Must", "github.com/gofrs/uuid.Must", "github.com/gofrs/uuid/v5.Must",
		"github.com/satori/go.uuid.Must",
		pkgIdem + ".Key", pkgIdem + ".RawKey", pkgWebhook + ".Key",
		pkgIdem + ".OperationKey.String":
		return true
	}
	if fn.Type().(*types.Signature).Recv() != nil {
		return false
	}
	return fn.Pkg() != nil && passThroughPkgs[fn.Pkg().Path()]
}

// receiverPassesThrough reports whether the method fn returns a value
// built from its receiver: time.Time's methods, a uuid's String, a
// strings.Builder's String, a hash's Sum.
func receiverPassesThrough(fn *types.Func, recv *types.Var) bool {
	switch fn.Name() {
	case "String", "Bytes", "Format", "AppendFormat", "Hex", "Text", "Sum", "Sum32", "Sum64", "MarshalText", "Load":
		return true
	}
	p := fn.Pkg()
	if p == nil {
		return false
	}
	switch p.Path() {
	case "time", "strings", "bytes", "sync/atomic", "math/big":
		return true
	}
	for g := range idGenerators {
		if strings.HasPrefix(g, p.Path()+".") {
			return true
		}
	}
	return false
}
