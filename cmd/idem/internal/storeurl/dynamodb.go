package storeurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
)

// openDynamoDB opens "dynamodb://TABLE?region=R&endpoint=URL":
// store/dynamostore on the table TABLE. Credentials and, without the
// region parameter, the region come from the AWS SDK's usual chain
// (AWS_ACCESS_KEY_ID..., AWS_REGION, ~/.aws/config, AWS_PROFILE, an
// instance role). endpoint names another endpoint than AWS's (an
// emulator such as dynalite, http://127.0.0.1:4567, with any
// credentials).
//
// With MustExist the table must exist with the store's key (an operator's
// command on a mistyped table fails instead of reporting an empty store);
// otherwise (the demo) it is created if missing, with TTL enabled where
// the endpoint has TTL.
func openDynamoDB(_ *Openers, ctx context.Context, raw, rest string, o Options) (store.Store, error) {
	scheme, _, _ := strings.Cut(raw, ":")
	u, err := url.Parse(strings.ToLower(scheme) + ":" + rest)
	if err != nil || !strings.HasPrefix(rest, "//") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("store %q: not a table URL; write dynamodb://TABLE?region=REGION (and &endpoint=URL for an emulator)", Redact(raw))
	}
	table := u.Host
	q := u.Query()
	var opts []func(*config.LoadOptions) error
	for k := range q {
		switch k {
		case "region", "endpoint":
		default:
			return nil, fmt.Errorf("store %q: unknown parameter %q (dynamodb:// takes region and endpoint)", Redact(raw), k)
		}
	}
	if r := q.Get("region"); r != "" {
		opts = append(opts, config.WithRegion(r))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("store %q: loading the AWS configuration: %w", Redact(raw), err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("store %q: no AWS region: add ?region=REGION or set AWS_REGION", Redact(raw))
	}
	client := dynamodb.NewFromConfig(cfg, func(do *dynamodb.Options) {
		if ep := q.Get("endpoint"); ep != "" {
			do.BaseEndpoint = aws.String(ep)
		}
	})
	if o.MustExist {
		err = dynamostore.CheckTable(ctx, client, table)
		if errors.Is(err, dynamostore.ErrNoTable) {
			return nil, fmt.Errorf("store %q: no table %s (name the workers' store with --store or IDEM_STORE, as they use it; dynamostore.CreateTable creates the table)", Redact(raw), table)
		}
	} else if err = dynamostore.CreateTable(ctx, client, table); errors.Is(err, dynamostore.ErrTTLUnsupported) {
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("store %q: %w", Redact(raw), err)
	}
	return dynamostore.New(client, table), nil
}
