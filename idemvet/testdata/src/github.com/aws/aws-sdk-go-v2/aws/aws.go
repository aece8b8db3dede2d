// Package aws is a stub of the SDK's aws package.
package aws

func String(v string) *string { return &v }
func ToString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
