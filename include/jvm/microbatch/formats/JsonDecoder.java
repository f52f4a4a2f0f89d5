package microbatch.formats;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The `json` format's decode of a value or key in one pass over its bytes (include/microbatch/formats/json.py,
 * `JvmJsonDecode`): Jackson's byte parser reads the object once, and each declared field is checked against its
 * type as it is read, so a number is never taken for a string. The rules are json.py's docstring's; the Spark
 * built-in decode there is the reference, and tests/integration/test_formats_decode.py holds the two equal.
 *
 * <p>Called as a Spark SQL function of (value binary, plan binary). The plan is the declared fields, one per line
 * after the subject ("value" or "key"): {@code column \t json name \t kind \t type name \t required (0/1)}, kinds
 * as {@link #kind}. The result is a row of the n columns (text for the kinds Spark's cast reads: TEXT, NUMBER_TEXT, EPOCH_TEXT),
 * then the n fields' problems (null: none), then the problem of the whole record (null: none).
 */
public final class JsonDecoder implements UDF2<byte[], byte[], Row> {
    private static final long serialVersionUID = 1L;
    private static final JsonFactory FACTORY = new JsonFactory();

    /** A JSON string, as it is. */
    static final int STRING = 0;
    /** A JSON string, whose text Spark's cast reads (date, timestamp, timestamp_ntz). */
    static final int TEXT = 1;
    static final int BOOLEAN = 2;
    static final int TINYINT = 3;
    static final int SMALLINT = 4;
    static final int INT = 5;
    static final int BIGINT = 6;
    /** Any JSON number, as a double (correctly rounded, as Double.parseDouble reads its text). */
    static final int DOUBLE = 7;
    /** Any JSON number, as its text, which Spark's cast reads (decimal). */
    static final int NUMBER_TEXT = 8;
    /** A JSON integer or string, as its text: an epoch number, whose digits Spark reads (a timestamp's `unit`). */
    static final int EPOCH_TEXT = 9;

    private static final class Plan {
        final String subject;
        final String[] names;
        final int[] kinds;
        final String[] notA;
        final boolean[] required;
        final Map<String, int[]> byJsonName = new HashMap<>();

        Plan(byte[] text) {
            String[] lines = new String(text, StandardCharsets.UTF_8).split("\n", -1);
            subject = lines[0];
            int n = lines.length - 1;
            names = new String[n];
            kinds = new int[n];
            notA = new String[n];
            required = new boolean[n];
            Map<String, List<Integer>> columns = new HashMap<>();
            for (int i = 0; i < n; i++) {
                String[] field = lines[i + 1].split("\t", -1);
                names[i] = field[0];
                kinds[i] = Integer.parseInt(field[2]);
                String type = field[3];
                notA[i] = subject + " field '" + field[0] + "' is not " + ("aeiou".indexOf(type.charAt(0)) >= 0
                        ? "an " : "a ") + type;
                required[i] = field[4].equals("1");
                columns.computeIfAbsent(field[1], k -> new ArrayList<>()).add(i);
            }
            columns.forEach((name, list) -> byJsonName.put(name, list.stream().mapToInt(Integer::intValue).toArray()));
        }
    }

    private transient byte[] planBytes;
    private transient Plan plan;

    private Plan plan(byte[] text) {
        if (text != planBytes && (planBytes == null || !Arrays.equals(text, planBytes))) {
            plan = new Plan(text);
        }
        planBytes = text;
        return plan;
    }

    @Override
    public Row call(byte[] data, byte[] planText) {
        Plan p = plan(planText);
        int n = p.names.length;
        Object[] out = new Object[2 * n + 1];
        if (data == null) {
            return RowFactory.create(out);  // a tombstone's value, a record without a key: nulls, not bad
        }
        String whole = wholeProblem(data, p.subject);
        if (whole == null) {
            whole = read(data, p, out);
        }
        if (whole != null) {
            Arrays.fill(out, null);
            out[2 * n] = whole;
        }
        return RowFactory.create(out);
    }

    /** Why the bytes are not a JSON document at all (invalid UTF-8, a lone surrogate escape), or null. */
    private static String wholeProblem(byte[] data, String subject) {
        if (!UTF8String.fromBytes(data).isValid()) {
            return subject + " is not valid UTF-8";
        }
        return mayEscapeSurrogate(data) && hasLoneSurrogate(data) ? subject + " is not JSON" : null;
    }

    /** Whether the bytes hold "\\u" followed by D8..DF, the escape of a UTF-16 surrogate (or look as if they do). */
    private static boolean mayEscapeSurrogate(byte[] data) {
        for (int i = 0; i + 3 < data.length; i++) {
            if (data[i] == '\\' && data[i + 1] == 'u' && (data[i + 2] | 0x20) == 'd') {
                int c = data[i + 3] | 0x20;
                if (c == '8' || c == '9' || (c >= 'a' && c <= 'f')) {
                    return true;
                }
            }
        }
        return false;
    }

    /** Whether any string or name of the document holds a surrogate without its pair (parse_json refuses it). */
    private static boolean hasLoneSurrogate(byte[] data) {
        try (JsonParser parser = FACTORY.createParser(data)) {
            int depth = 0;
            for (JsonToken t = parser.nextToken(); t != null; t = depth == 0 ? null : parser.nextToken()) {
                depth += t.isStructStart() ? 1 : t.isStructEnd() ? -1 : 0;
                if (t == JsonToken.VALUE_STRING || t == JsonToken.FIELD_NAME) {
                    String text = parser.getText();
                    for (int i = 0; i < text.length(); i++) {
                        char c = text.charAt(i);
                        if (Character.isHighSurrogate(c) && i + 1 < text.length()
                                && Character.isLowSurrogate(text.charAt(i + 1))) {
                            i++;
                        } else if (Character.isSurrogate(c)) {
                            return true;
                        }
                    }
                }
            }
        } catch (Exception e) {
            return false;  // not JSON: read() says so
        }
        return false;
    }

    /** Reads the object into `out`; the problem of the whole record, or null. */
    private static String read(byte[] data, Plan p, Object[] out) {
        int n = p.names.length;
        boolean[] seen = new boolean[n];
        boolean[] isNull = new boolean[n];
        try (JsonParser parser = FACTORY.createParser(data)) {
            JsonToken first = parser.nextToken();
            if (first == null) {
                return p.subject + " is not JSON";
            }
            if (first != JsonToken.START_OBJECT) {
                parser.skipChildren();
                return p.subject + " is not a JSON object";
            }
            JsonToken token;
            while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
                int[] columns = p.byJsonName.get(parser.currentName());
                JsonToken value = parser.nextToken();
                if (columns != null) {
                    for (int i : columns) {  // a repeated name: its last value is the field's
                        seen[i] = true;
                        isNull[i] = value == JsonToken.VALUE_NULL;
                        out[i] = isNull[i] ? null : value(parser, value, p.kinds[i]);
                        out[n + i] = isNull[i] || out[i] != null ? null : p.notA[i];
                    }
                }
                parser.skipChildren();
            }
            if (token != JsonToken.END_OBJECT) {
                return p.subject + " is not JSON";
            }  // what follows the object is not read, as Spark's from_json and parse_json do not read it
        } catch (Exception e) {
            return p.subject + " is not JSON";
        }
        for (int i = 0; i < n; i++) {
            if (p.required[i] && !seen[i]) {
                out[n + i] = p.subject + " lacks the required field '" + p.names[i] + "'";
            } else if (p.required[i] && isNull[i]) {
                out[n + i] = p.subject + " field '" + p.names[i] + "' is null but required";
            }
        }
        return null;
    }

    /** The value of the current token as `kind` reads it, or null when it is of another JSON type or range. */
    private static Object value(JsonParser parser, JsonToken token, int kind) throws java.io.IOException {
        switch (kind) {
            case STRING:
            case TEXT:
                return token == JsonToken.VALUE_STRING ? parser.getText() : null;
            case BOOLEAN:
                return token == JsonToken.VALUE_TRUE ? Boolean.TRUE : token == JsonToken.VALUE_FALSE ? Boolean.FALSE
                        : null;
            case DOUBLE:
                return token.isNumeric() ? (Object) parser.getDoubleValue() : null;
            case NUMBER_TEXT:
                return token.isNumeric() ? parser.getText() : null;
            case EPOCH_TEXT:
                return token == JsonToken.VALUE_STRING || token == JsonToken.VALUE_NUMBER_INT ? parser.getText() : null;
            default:
                if (token != JsonToken.VALUE_NUMBER_INT || parser.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
                    return null;
                }
                long v = parser.getLongValue();
                switch (kind) {
                    case TINYINT:
                        return v == (byte) v ? (Object) (byte) v : null;
                    case SMALLINT:
                        return v == (short) v ? (Object) (short) v : null;
                    case INT:
                        return v == (int) v ? (Object) (int) v : null;
                    default:
                        return v;
                }
        }
    }
}
