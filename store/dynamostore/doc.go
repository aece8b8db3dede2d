// Package dynamostore is an idem.Store kept in DynamoDB.
package dynamostore
