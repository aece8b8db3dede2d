package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

var (
	// ErrNoTable is wrapped by the error of [CheckTable] for a table that
	// does not exist.
	ErrNoTable = errors.New("dynamostore: no such table")
	// ErrTableSchema is wrapped by the error of [CheckTable] and
	// [CreateTable] for a table whose key is not a string partition key
	// named [AttrKey] (and nothing else).
	ErrTableSchema = errors.New("dynamostore: the table's key is not the store's")
	// ErrTTLUnsupported is wrapped by the error of [CreateTable] when the
	// table is ready but the endpoint does not implement UpdateTimeToLive
	// (DynamoDB emulators such as dynalite). The store works without TTL:
	// expiry is checked on every read, and [Store.Sweep] deletes expired
	// records.
	ErrTTLUnsupported = errors.New("dynamostore: the endpoint does not support TTL")
)

// CreateTable makes table ready for a [Store]: it creates it if it does not
// exist (partition key [AttrKey], a string; on-demand capacity,
// PAY_PER_REQUEST), waits until it is ACTIVE, checks its key, and enables
// TTL on [AttrTTL] unless TTL is already enabled on it. A table that
// already exists with the right key is left as it is (its capacity mode
// included). ctx bounds the whole wait.
//
// When the endpoint does not implement TTL, the table is ready and the
// error wraps [ErrTTLUnsupported]. When TTL is already enabled on another
// attribute, the error says so: DynamoDB allows one TTL attribute per
// table, and the store's records would then never be deleted by TTL.
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrKey), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrKey), KeyType: types.KeyTypeHash},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("dynamostore: creating table %s: %w", table, err)
	}
	if err := waitActive(ctx, client, table); err != nil {
		return err
	}
	if err := CheckTable(ctx, client, table); err != nil {
		return err
	}
	return enableTTL(ctx, client, table)
}

// waitActive polls the table's status until it is ACTIVE.
func waitActive(ctx context.Context, client *dynamodb.Client, table string) error {
	delay := 20 * time.Millisecond
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		var nf *types.ResourceNotFoundException
		if err != nil && !errors.As(err, &nf) {
			return fmt.Errorf("dynamostore: waiting for table %s: %w", table, err)
		}
		if err == nil && out.Table.TableStatus == types.TableStatusActive {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dynamostore: waiting for table %s to be ACTIVE: %w", table, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// CheckTable checks that table exists with the key a [Store] needs (a
// string partition key named [AttrKey], no sort key). Its errors wrap
// [ErrNoTable] or [ErrTableSchema], or are the client's.
func CheckTable(ctx context.Context, client *dynamodb.Client, table string) error {
	out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return fmt.Errorf("%w: %s", ErrNoTable, table)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: describing table %s: %w", table, err)
	}
	ks := out.Table.KeySchema
	if len(ks) != 1 || aws.ToString(ks[0].AttributeName) != AttrKey || ks[0].KeyType != types.KeyTypeHash {
		return fmt.Errorf("%w: table %s must have only the partition key %q", ErrTableSchema, table, AttrKey)
	}
	for _, ad := range out.Table.AttributeDefinitions {
		if aws.ToString(ad.AttributeName) == AttrKey && ad.AttributeType != types.ScalarAttributeTypeS {
			return fmt.Errorf("%w: the partition key %q of table %s is of type %s, want S (a string)", ErrTableSchema, AttrKey, table, ad.AttributeType)
		}
	}
	return nil
}

func unknownOperation(err error) bool {
	var ae interface{ ErrorCode() string }
	return errors.As(err, &ae) && ae.ErrorCode() == "UnknownOperationException"
}

func enableTTL(ctx context.Context, client *dynamodb.Client, table string) error {
	d, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
	if unknownOperation(err) {
		return fmt.Errorf("%w: table %s is ready, without TTL", ErrTTLUnsupported, table)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: describing TTL of table %s: %w", table, err)
	}
	if t := d.TimeToLiveDescription; t != nil {
		switch t.TimeToLiveStatus {
		case types.TimeToLiveStatusEnabled, types.TimeToLiveStatusEnabling:
			if a := aws.ToString(t.AttributeName); a != AttrTTL {
				return fmt.Errorf("dynamostore: table %s has TTL on %q, not on the store's %q: expired records would stay until Store.Sweep deletes them", table, a, AttrTTL)
			}
			return nil
		}
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(AttrTTL),
			Enabled:       aws.Bool(true),
		},
	})
	if unknownOperation(err) {
		return fmt.Errorf("%w: table %s is ready, without TTL", ErrTTLUnsupported, table)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: enabling TTL on %s of table %s: %w", AttrTTL, table, err)
	}
	return nil
}
