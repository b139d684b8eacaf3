// A comment that tells its history instead of its reason (issue 18).
int x;
